"""Every ``/health`` probe waits longer than a real SGLang server takes to answer it.

SGLang's ``/health`` sleeps 1 s before its first look (``http_server.py`` ``health_generate``):
a probe with a timeout near 1 s sees every healthy server as down.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from include.engine.pool import ServerPool
from include.monitor.runs import RunMonitor
from include.servers.commands import ServerSpec
from include.servers.expectations import ModelExpectation
from include.servers.triggers import ServerHealthTrigger
from include.sglang.contract import (
    HEALTH_ANSWER_MIN_S,
    HEALTH_PROBE_TIMEOUT_FLOOR_S,
    health_probe_timeout_s,
)
from include.storage import LocalStore

ROOT = Path(__file__).resolve().parents[3]
INTERVALS = [0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 60.0]


def test_the_floor_leaves_room_above_sglangs_one_second_sleep() -> None:
    assert HEALTH_ANSWER_MIN_S == 1.0
    assert HEALTH_PROBE_TIMEOUT_FLOOR_S >= 2 * HEALTH_ANSWER_MIN_S
    assert health_probe_timeout_s() == HEALTH_PROBE_TIMEOUT_FLOOR_S
    assert health_probe_timeout_s(0.5) == HEALTH_PROBE_TIMEOUT_FLOOR_S
    assert health_probe_timeout_s(30.0) == 30.0


@pytest.mark.parametrize("interval", INTERVALS)
def test_the_gate_and_the_engine_never_probe_for_less_than_the_floor(interval: float) -> None:
    trigger = ServerHealthTrigger(
        server=ServerSpec("127.0.0.1", 0, 30000, None, "/tmp/x").to_dict(),
        expected=ModelExpectation("qwen", 4096).to_dict(), deadline=0.0, poke_interval=interval,
    )
    pool = ServerPool(["http://a"], mode="fixed", start_window=1, min_window=1, max_window=1,
                      cool_down_after_failures=3, health_interval_s=interval)
    for timeout in (trigger.health_timeout_s(), pool.probe_timeout_s()):
        assert timeout >= HEALTH_PROBE_TIMEOUT_FLOOR_S > HEALTH_ANSWER_MIN_S


def test_the_monitor_never_probes_for_less_than_the_floor(tmp_path: Path) -> None:
    assert RunMonitor(LocalStore(tmp_path)).probe_timeout_s >= HEALTH_PROBE_TIMEOUT_FLOOR_S
    # Even asked for the old 1 s, which showed every real server down.
    asked = RunMonitor(LocalStore(tmp_path), probe_timeout_s=1.0)
    assert asked.probe_timeout_s >= HEALTH_PROBE_TIMEOUT_FLOOR_S


def test_every_module_probing_health_takes_its_timeout_from_the_one_module() -> None:
    probing = [p for base in ("include", "plugins") for p in (ROOT / base).rglob("*.py")
               if re.search(r"""["']/health["']""", p.read_text())]
    # Every probe (pool, trigger, monitor) goes through include.sglang, which spells the path
    # once, beside the floor.
    assert {p.relative_to(ROOT).as_posix() for p in probing} == {"include/sglang/contract.py"}
    for path in probing:
        if path.name == "contract.py":
            continue  # where the floor itself is defined
        assert re.search(r"include\.sglang\.contract import", path.read_text()), (
            f"{path.relative_to(ROOT)} probes /health: take its timeout from "
            "include.sglang.contract.health_probe_timeout_s (SGLang's /health sleeps 1 s)")
