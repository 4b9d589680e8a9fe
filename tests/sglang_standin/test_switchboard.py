"""The switchboard stand-in: faults switched through a file while it runs, busy-time counters."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_standin.switchboard import POLL_S, SwitchboardServer, parse_faults, write_faults
from sglang_standin.testing import ThreadServer, call, chat
from tests.sglang_standin.conftest import FAST_FLAGS


def test_parse_faults_keeps_known_faults_and_names_what_is_wrong() -> None:
    assert parse_faults("") == {}
    assert parse_faults('{"hold_health": false, "time_scale": 2}') == {"time_scale": 2.0}
    assert parse_faults('{"hold_health": 1, "brownout_until": 5}') == {
        "hold_health": True, "brownout_until": 5.0}
    with pytest.raises(ValueError, match=r"unknown faults \['slow'\]; known: hold_health"):
        parse_faults('{"slow": 1}')
    with pytest.raises(ValueError, match="a JSON object of faults is needed, not list"):
        parse_faults("[]")
    with pytest.raises(ValueError, match="time_scale must be above 0, got -1"):
        parse_faults('{"time_scale": -1}')


def _until(predicate, what: str, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S / 2)
    raise AssertionError(f"not within {timeout}s: {what}")


def _metric(server: ThreadServer, name: str) -> float:
    text = call("GET", server.url + "/metrics").body.decode()
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics:\n{text[-1500:]}"
    return float(match.group(1))


@pytest.fixture
def switchboard(tokenizer: Any, tokenizer_dir: Path, tmp_path: Path):
    fault_file = tmp_path / "faults.json"

    def make(config, tokenizer=None) -> SwitchboardServer:
        return SwitchboardServer(config, str(fault_file), tokenizer=tokenizer)

    server = ThreadServer.start(tokenizer, tokenizer_dir, make=make, enable_metrics=True,
                                **FAST_FLAGS)
    server.fault_file = fault_file  # type: ignore[attr-defined]
    yield server
    server.close()


def test_faults_follow_the_file_and_busy_time_is_counted(switchboard: ThreadServer) -> None:
    faults: Path = switchboard.fault_file  # type: ignore[attr-defined]
    assert _metric(switchboard, "standin:first_busy_timestamp_seconds") == 0.0
    assert chat(switchboard).status == 200
    busy = _metric(switchboard, "standin:busy_seconds_total")
    assert busy > 0.0
    assert _metric(switchboard, "standin:last_busy_timestamp_seconds") >= \
        _metric(switchboard, "standin:first_busy_timestamp_seconds") > 0.0

    # A model "loading": /health 503 until the file says otherwise; generation untouched.
    write_faults(faults, hold_health=True)
    _until(lambda: call("GET", switchboard.url + "/health").status == 503, "health held")
    write_faults(faults)
    _until(lambda: call("GET", switchboard.url + "/health").status == 200, "health released")

    # A brownout: generation answers SGLang's queue-full 503 at once, /health stays 200.
    write_faults(faults, brownout_until=time.time() + 60)
    reply = _until(lambda: (r := chat(switchboard)).status == 503 and r, "brownout")
    assert "queue is full" in reply.body.decode().lower()
    assert call("GET", switchboard.url + "/health").status == 200
    rejected = _metric(switchboard, "standin:brownout_rejected_total")
    assert rejected >= 1
    # An unreadable file keeps the faults in force rather than dropping them.
    faults.write_text("{not json")
    time.sleep(3 * POLL_S)
    assert chat(switchboard).status == 503
    assert _metric(switchboard, "standin:brownout_rejected_total") == rejected + 1
    faults.unlink()
    _until(lambda: chat(switchboard).status == 200, "brownout over when the file is gone")
    assert _metric(switchboard, "standin:busy_seconds_total") > busy
