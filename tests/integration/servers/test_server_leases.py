"""Two runs sharing servers over a real sshd: leases, refusals, failed launches and teardowns.

Each "run" is an owner, as the DAG passes ``<dag_id>/<run_id>``: a backfill launched while
another run generates reuses its servers and must not lose them to the other run's teardown.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from include.servers.hosts import HostError
from include.servers.launch_report import LaunchReport, StopError, XComMismatchError
from include.servers.launcher import launch_servers, stop_servers
from include.settings import RunSettings
from tests.integration.servers.helpers import answers, wait_answering

SettingsFactory = Callable[..., RunSettings]

pytestmark = pytest.mark.integration

RUN_A, RUN_B = "regenerate_drafter_data/run A", "regenerate_drafter_data/backfill B"


def host(gpus: list[int], conn: str = "ssh_loopback", name: str = "127.0.0.1") -> dict[str, Any]:
    return {"host": name, "ssh_conn_id": conn, "gpus": gpus}


def test_a_backfill_keeps_the_servers_of_the_run_it_shares_them_with(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(hosts=[host([0, 1])], api_key="sk-shared")
    a = launch_servers(settings, owner=RUN_A)
    assert [s.action for s in a.servers] == ["started", "started"]
    # Loaded (a server still loading is leased as `loading`: test_loading_servers.py).
    assert all(wait_answering(url) for url in a.urls)
    b = launch_servers(settings, owner=RUN_B)
    assert [s.action for s in b.servers] == ["reused", "reused"]
    assert all(s.leased and not s.started_by_this_run for s in b.servers)

    # Run A finishes first: its teardown releases its leases and stops nothing.
    first = stop_servers(LaunchReport.from_dict(a.to_dict(), settings), settings)
    assert first.stopped == [] and len(first.kept) == 2, first.to_dict()
    assert RUN_B in first.kept[0]
    assert all(answers(url) for url in a.urls)

    # Replacing a server another run leases is refused, even when asked.
    other = make_settings({"context_length": 2048, "replace_mismatched_servers": True},
                          hosts=[host([0, 1])], api_key="sk-shared")  # fmt: skip
    refused = launch_servers(other, owner="regenerate_drafter_data/run C")
    assert [s.action for s in refused.servers] == ["mismatched", "mismatched"]
    assert "lease it" in refused.servers[0].detail and RUN_B in refused.servers[0].detail
    assert stop_servers(refused, other).skipped and all(answers(url) for url in a.urls)

    # The last run's teardown stops them, and their key files go with them.
    last = stop_servers(b.to_dict(), settings)
    assert len(last.stopped) == 2 and last.left_behind == [] and last.kept == []
    assert not any(answers(url) for url in a.urls)
    assert not [s for s in a.servers if Path(s.server.paths.config_file).exists()]


def test_a_launch_failing_on_host_2_leaves_nothing_of_it_on_host_1(
    make_settings: SettingsFactory, sshd: Any
) -> None:
    # Run A uses GPU 0; run B would use GPUs 0 and 2 on host 1 and GPU 1 on host 2, which it
    # cannot reach. B's failure stops the server it started (GPU 2) and keeps A's (GPU 0).
    first = make_settings(hosts=[host([0])])
    a = launch_servers(first, owner=RUN_A)
    # A's server serves before B launches (on a loaded machine it may still be starting; B
    # would then lease it as loading, which the loading tests cover).
    assert wait_answering(a.urls[0])
    settings = make_settings(hosts=[host([0, 2]), host([1], sshd.bad_key_conn_id, "localhost")])
    with pytest.raises(HostError) as err:
        launch_servers(settings, owner=RUN_B, connect_attempts=1)
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert "released what this launch had started or leased" in notes
    gpu0, gpu2 = (f"http://127.0.0.1:{settings.deployment.port_base + g}" for g in (0, 2))
    assert answers(gpu0) and not answers(gpu2)
    assert "kept for 1 other run(s)" in notes and RUN_A in notes
    assert len(stop_servers(a, first).stopped) == 1 and not answers(gpu0)


def test_a_teardown_that_cannot_stop_a_server_raises(
    make_settings: SettingsFactory, sshd: Any
) -> None:
    settings = make_settings(hosts=[host([0])])
    report = launch_servers(settings, owner=RUN_A)
    assert wait_answering(report.urls[0])
    # The deployment's SSH connection to the host is broken (the same host and port).
    unreachable = make_settings(hosts=[host([0], sshd.bad_key_conn_id)])
    with pytest.raises(StopError) as err:
        stop_servers(report.to_dict(), unreachable, connect_attempts=1)
    assert "authentication failed" in str(err.value) and err.value.report.left_behind
    assert answers(report.urls[0])
    assert len(stop_servers(report, settings).stopped) == 1


def test_a_launch_report_edited_in_xcom_runs_nothing_and_the_real_one_stops_the_server(
    make_settings: SettingsFactory, sshd: Any, tmp_path: Path
) -> None:
    settings = make_settings(hosts=[host([0])])
    report = launch_servers(settings, owner=RUN_A)
    assert wait_answering(report.urls[0])
    pwned = tmp_path / "pwned"
    edits = [{"command_prefix": f"touch {pwned};"}, {"ssh_conn_id": sshd.bad_key_conn_id},
             {"host": "localhost"}, {"log_dir": str(tmp_path)}]
    for edit in edits:
        data = report.to_dict()
        data["servers"][0]["server"].update(edit)
        with pytest.raises(XComMismatchError, match="XCom did not match the deployment"):
            stop_servers(data, settings, owner=RUN_A, connect_attempts=1)
    assert not pwned.exists() and answers(report.urls[0])  # nothing ran, nothing stopped
    assert len(stop_servers(report.to_dict(), settings, owner=RUN_A).stopped) == 1
    assert not answers(report.urls[0])
