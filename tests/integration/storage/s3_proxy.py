"""A store that misbehaves on request: moto_server behind a loopback HTTP proxy with a rule.

The proxy forwards every request to a moto_server of its own; its ``rule`` decides, per
request, to pass it (``PASS``), to drop ``If-None-Match`` first (``DROP``: an older MinIO,
or a gateway that strips the header), or to answer 501 NotImplemented itself (``REFUSE``: a
store without conditional writes). The rule can change while a test runs: a store proven
once, then put behind something else, at the same endpoint. This moto does not check
signatures (a dropped header is signed), so it is apart from ``tests.fixtures.s3``'s.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.fixtures.ports import free_port_block
from tests.fixtures.s3 import REGION, _wait_up, stop

PASS, DROP, REFUSE = "pass", "drop", "refuse"
#: ``rule(method, path_and_query, headers) -> PASS | DROP | REFUSE``.
Rule = Callable[[str, str, dict[str, str]], str]
CONN_ID = "regen_proxy_s3"

_NOT_IMPLEMENTED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
                    b"<Message>A header you provided implies functionality that is not "
                    b"implemented</Message><Header>If-None-Match</Header></Error>")


def always(verdict: str) -> Rule:
    """Return a rule that gives ``verdict`` to every conditional request."""
    return lambda method, path, headers: verdict


def on_completion(verdict: str) -> Rule:
    """Return a rule for CompleteMultipartUpload only (POST ...?uploadId=...)."""
    return lambda method, path, headers: (
        verdict if method == "POST" and "uploadId=" in path else PASS)


def under(prefix: str, verdict: str) -> Rule:
    """Return a rule for keys under ``/<bucket>/<prefix>`` only (a store that differs by path)."""
    def rule(method: str, path: str, headers: dict[str, str]) -> str:
        key = urlsplit(path).path.split("/", 2)[-1]
        return verdict if key.startswith(prefix) else PASS
    return rule


@dataclass
class ProxiedStore:
    """The proxy's URL, the Airflow connection naming it, and the rule it applies now."""

    url: str
    upstream: str
    rule: Rule = field(default=always(PASS))
    seen: list[str] = field(default_factory=list)
    conn_id: str = CONN_ID

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name=REGION,
                            aws_access_key_id="proxy", aws_secret_access_key="proxy")


def _handler(store: ProxiedStore) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(store.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items()}
            conditional = any(k.lower() == "if-none-match" for k in headers)
            verdict = store.rule(self.command, self.path, headers) if conditional else PASS
            store.seen.append(f"{self.command} {self.path} {verdict if conditional else ''}")
            if verdict == REFUSE:
                self._answer(501, {"Content-Type": "application/xml"}, _NOT_IMPLEMENTED)
                return
            dropped = {"expect"} | ({"if-none-match"} if verdict == DROP else set())
            headers = {k: v for k, v in headers.items() if k.lower() not in dropped}
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                self._answer(reply.status, dict(reply.getheaders()), data)
            finally:
                conn.close()

        def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection",
                                        "date", "server"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

    return Handler


@contextmanager
def proxied_store(log_dir: Path) -> Iterator[ProxiedStore]:
    """Run moto_server (no authentication) and the proxy; define the Airflow connection."""
    port = free_port_block()
    upstream = f"http://127.0.0.1:{port}"
    with open(log_dir / "moto_behind_proxy.log", "wb") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
             str(port)], stdout=log, stderr=subprocess.STDOUT)
    server = None
    env = f"AIRFLOW_CONN_{CONN_ID.upper()}"
    saved = os.environ.get(env)
    try:
        _wait_up(upstream, proc)
        store = ProxiedStore(url="", upstream=upstream)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
        store.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        os.environ[env] = json.dumps({"conn_type": "aws", "login": "proxy", "password": "proxy",
                                      "extra": {"endpoint_url": store.url,
                                                "region_name": REGION}})
        yield store
    finally:
        if saved is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = saved
        if server is not None:
            server.shutdown()
            server.server_close()
        stop(proc)
