"""The one SGLang client: each call against a real local HTTP server, and who may make them."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest

from include.sglang import aio, contract, sync
from include.sglang.contract import Failure

ROOT = Path(__file__).resolve().parents[3]
KEY = "sk-test"
MODELS = {"object": "list", "data": [
    {"id": "other", "object": "model", "max_model_len": 2048},
    {"id": "qwen", "object": "model", "max_model_len": 4096},
]}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/moved/health":
            self._send(302, b"", Location="/health")
        elif self.path == "/slow/health":
            time.sleep(1.0)
            self._send(200, b"")
        elif self.path == "/v1/models":
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self._send(401, b'{"error": "Unauthorized"}')
            else:
                self._send(200, json.dumps(MODELS).encode())
        elif self.path == "/server_info":
            self._send(200, b'{"version": "0.5.23", "tp_size": 1}')
        elif self.path == "/metrics":
            self._send(200, b"sglang:num_queue_reqs 3\n")
        else:
            self._send(404, b"not found")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = {"path": self.path, "got": body, "auth": self.headers.get("Authorization")}
        self._send(200, json.dumps(answer).encode())


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- pure parses ---------------------------------------------------------------------------
def test_served_model_takes_the_named_entry_else_the_first() -> None:
    assert contract.served_model(MODELS, "qwen") == contract.ServedModel("qwen", 4096)
    assert contract.served_model(MODELS) == contract.ServedModel("other", 2048)
    assert contract.served_model(MODELS, "absent").id == "other"
    odd = {"data": [{"id": "x", "max_model_len": "4096"}]}
    assert contract.served_model(odd).max_model_len is None  # not a number: unknown


@pytest.mark.parametrize("answer", [{}, {"data": []}, {"data": "x"}, [], None, {"error": "x"}])
def test_served_model_raises_lookup_error_when_no_model_is_listed(answer: object) -> None:
    with pytest.raises(LookupError, match="lists no model"):
        contract.served_model(answer)


def test_the_version_and_the_key_header() -> None:
    assert contract.server_version({"version": "0.5.23"}) == "0.5.23"
    assert contract.server_version({"version": 5}) == "5"
    assert contract.server_version({"tp_size": 1}) is None
    assert contract.server_version("0.5.23") is None
    assert contract.bearer("k") == {"Authorization": "Bearer k"}
    assert contract.bearer(None) == {} and contract.bearer("") == {}


def test_the_401_cause_names_the_connection() -> None:
    assert "Airflow connection 'sglang_x' (REGEN_SGLANG_CONN_ID)" in (
        contract.unauthorized_cause("sglang_x"))
    assert "named by REGEN_SGLANG_CONN_ID" in contract.unauthorized_cause(None)


# --- sync (urllib) -------------------------------------------------------------------------
def test_sync_models_sends_the_key_and_reads_the_answer(server: str) -> None:
    answer = sync.models(server, KEY)
    assert answer.status == 200 and answer.answered
    assert contract.served_model(answer.json(), "qwen").max_model_len == 4096
    denied = sync.models(server, "wrong")
    assert denied.answered and denied.status == 401 and b"Unauthorized" in denied.body


def test_sync_health_follows_no_redirect(server: str) -> None:
    assert sync.health(server, 0.0).status == 200
    moved = sync.health(server + "/moved", 0.0)
    assert moved.answered and moved.status == 302
    # The plain get follows it, as urllib does: the refusal is health's own.
    assert sync.get(server + "/moved", "/health").status == 200


def test_sync_failures_are_answers_not_exceptions(server: str, closed_port_url: str) -> None:
    refused = sync.models(closed_port_url)
    assert refused.failure == Failure.CONNECT and refused.refused and not refused.answered
    slow = sync.get(server + "/slow", "/health", timeout=0.2)
    assert slow.failure == Failure.TIMEOUT and slow.status is None


# --- async (aiohttp) -----------------------------------------------------------------------
def test_async_calls_against_a_server(server: str) -> None:
    async def go() -> dict[str, contract.Answer]:
        async with aiohttp.ClientSession() as session:
            return {
                "health": await aio.health(session, server, 5.0),
                "models": await aio.models(session, server, contract.bearer(KEY), timeout=5),
                "info": await aio.server_info(session, server),
                "metrics": await aio.metrics(session, server, timeout=5),
                "chat": await aio.chat(session, server, {"model": "qwen"}, contract.bearer(KEY)),
            }

    got = asyncio.run(go())
    assert got["health"].status == 200
    assert contract.served_model(got["models"].json(), "qwen").max_model_len == 4096
    assert contract.server_version(got["info"].json()) == "0.5.23"
    assert got["metrics"].text() == "sglang:num_queue_reqs 3\n"
    assert got["chat"].json() == {"path": "/v1/chat/completions", "got": {"model": "qwen"},
                                  "auth": f"Bearer {KEY}"}


def test_async_failures_are_answers_not_exceptions(server: str, closed_port_url: str) -> None:
    async def go() -> tuple[contract.Answer, contract.Answer]:
        async with aiohttp.ClientSession() as session:
            return (await aio.health(session, closed_port_url, 5.0),
                    await aio.get(session, server + "/slow", "/health", timeout=0.2))

    refused, slow = asyncio.run(go())
    assert refused.failure == Failure.CONNECT and refused.refused
    assert isinstance(refused.error, aiohttp.ClientConnectorError)
    assert slow.failure == Failure.TIMEOUT and isinstance(slow.error, TimeoutError)


# --- who speaks to SGLang ------------------------------------------------------------------
ENDPOINT = re.compile(
    r"""["'](/health|/v1/models|/server_info|/metrics|/v1/chat/completions)["']""")


def test_only_the_client_names_sglangs_endpoints() -> None:
    naming = {p.relative_to(ROOT).as_posix() for base in ("include", "plugins", "dags")
              for p in (ROOT / base).rglob("*.py") if ENDPOINT.search(p.read_text())}
    assert "include/sglang/contract.py" in naming
    strays = {p for p in naming if not p.startswith("include/sglang/")}
    assert not strays, f"call SGLang through include.sglang (sync or aio), not directly: {strays}"


def test_the_client_imports_neither_airflow_nor_the_stages() -> None:
    for path in (ROOT / "include" / "sglang").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                # The connection hook is Airflow's by nature; no client module imports it.
                assert path.name == "hook.py" or not name.startswith("airflow"), (
                    f"{path.name} imports {name}")
                assert name != "include.sglang.hook", f"{path.name} imports the hook"
                # Only the vocabulary leaf below it (the words a failure is told in).
                assert not name.startswith("include.") or name.startswith(
                    ("include.sglang", "include.outcomes")), (
                    f"{path.name} imports {name}: the client is a leaf any stage may import")


def test_the_sync_side_loads_without_aiohttp() -> None:
    code = ("import sys, include.sglang.sync, include.sglang.contract; "
            "print('aiohttp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
