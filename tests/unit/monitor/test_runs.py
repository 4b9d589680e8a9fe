"""Run states for the monitor page, from a synthetic run's files."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from include.monitor.runs import (
    NOT_OURS,
    RATE_WINDOW_S,
    RunMonitor,
    generation_average,
    is_report_file,
    journal_rate,
)
from include.storage import LocalStore
from tests.fixtures.settings import run_settings
from tests.unit.reporting.synthetic_run import (
    T0,
    ShardSpec,
    write_prompts_manifest,
    write_run,
    write_shard,
)


def test_done_running_and_left_shards_with_rows_rate_and_eta(tmp_path) -> None:
    run = LocalStore(tmp_path / "syn")
    shards = {"shard-00000": ShardSpec(completed=8, skipped=1, failed=1),
              "shard-00001": ShardSpec(completed=6, journal_only=True),
              "shard-00002": ShardSpec(completed=10)}
    write_prompts_manifest(run, shards)
    write_shard(run, "shard-00000", shards["shard-00000"])
    # Shard 1 is generating: its journal holds 6 finished prompts (T0+1..T0+6), no manifest.
    spec = ShardSpec(completed=6, journal_only=True)
    write_shard(run, "shard-00001", spec)
    monitor = RunMonitor(LocalStore(tmp_path))
    assert monitor.run_names() == ["syn"]
    state = monitor.run_state("syn", now=T0 + 60, probe=False)
    loc = state["locations"][0]
    assert (loc["shards_done"], loc["shards_running"], loc["shards_left"]) == (1, 1, 1)
    assert loc["rows"] == {"completed": 14, "truncated": 0, "skipped": 1, "failed": 1}
    assert loc["generating"] == [{"shard_id": "shard-00001", "finished": 6, "prompts": 6}]
    assert (loc["tokenizing"], loc["left"]) == ([], ["shard-00002"])
    # Shard 1 holds 6 prompts and all 6 are finished; shard 2's 10 are left.
    assert loc["remaining_prompts"] == 10
    # Completions 1 s apart (T0+1..T0+6): 5 intervals carry the last five answers' tokens.
    assert loc["tokens_per_s"] == sum(101 + i for i in range(5)) / 5
    assert loc["rate_basis"] == "window"
    assert (loc["idle_s"], loc["eta_s"]) == (54, 10)
    assert {s["url"] for s in loc["servers"]} == {"http://s0:1", "http://s1:1"}


def test_a_forced_regeneration_is_its_own_location_and_reports_are_linked(tmp_path) -> None:
    from include.reporting import QualityGates, build_report

    shards = {"shard-00000": ShardSpec(completed=4)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)
    regen = LocalStore(tmp_path / "syn" / "regenerations" / "manual_1")
    write_shard(regen, "shard-00000", shards["shard-00000"])
    settings = run_settings({"run_name": "syn"}, output_root=str(tmp_path))
    build_report(settings, run, regen, ["shard-00000"], [], run_id="manual_1",
                 gates=QualityGates(max_quarantine_rate=1), plots=False)
    state = RunMonitor(LocalStore(tmp_path)).run_state("syn", now=T0, probe=False)
    main, forced = state["locations"]
    assert main["location"] == "." and main["shards_done"] == 0 and main["shards_left"] == 1
    assert forced["location"] == "regenerations/manual_1" and forced["shards_done"] == 1
    # Issue 34, item 4: the dataset card beside the report, one click from the run.
    assert forced["reports"] == [{"airflow_run_id": "manual_1", "passed": True,
                                  "key": "syn/regenerations/manual_1/report/manual_1/"
                                         "report.html",
                                  "card": "syn/regenerations/manual_1/report/manual_1/"
                                          "README.md"}]
    assert is_report_file(forced["reports"][0]["card"])  # and the page's route serves it


# --- tokens/s and ETA from the journals' own clock -------------------------------------------
def test_rate_of_a_known_steady_run_is_measured_over_the_last_window() -> None:
    # Two servers, each answering 200 tokens every second, offset by half a second, for ten
    # minutes: 400 tokens/s and 2 prompts/s, whenever the page looks.
    finished = [(T0 + i / 2, 200) for i in range(1200)]
    rate = journal_rate(finished)
    assert rate is not None and rate.as_of == T0 + 599.5
    assert (rate.tokens_per_s, rate.prompts_per_s) == (400.0, 2.0)
    # A burst that ended long ago does not count in the window.
    rate = journal_rate([(T0 - 3600, 10**6), *finished])
    assert rate is not None and rate.tokens_per_s == 400.0


def test_rate_before_the_window_fills_spans_first_to_last_completion() -> None:
    # 30 s into a shard at 3 prompts/s of 50 tokens: a fixed window divisor would say 4x less.
    finished = [(T0 + 10 + i / 3, 50) for i in range(91)]
    rate = journal_rate(finished)
    assert rate is not None
    assert abs(rate.tokens_per_s - 150.0) < 1e-6 and abs(rate.prompts_per_s - 3.0) < 1e-6
    assert journal_rate([]) is None and journal_rate([(T0, 5), (T0, 7)]) is None
    assert RATE_WINDOW_S == 120.0  # the window the page says it uses


def test_an_idle_run_has_no_eta(tmp_path) -> None:
    shards = {"shard-00000": ShardSpec(completed=6, journal_only=True),
              "shard-00001": ShardSpec(completed=10)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)
    write_shard(run, "shard-00000", shards["shard-00000"])
    loc = RunMonitor(LocalStore(tmp_path)).run_state(
        "syn", now=T0 + 6 + RATE_WINDOW_S + 1, probe=False)["locations"][0]
    assert loc["idle_s"] == RATE_WINDOW_S + 1 and loc["eta_s"] is None
    assert loc["remaining_prompts"] == 10 and loc["tokens_per_s"] > 0


def test_a_shard_that_started_without_answers_yet_is_generating(tmp_path) -> None:
    shards = {"shard-00000": ShardSpec(completed=4), "shard-00001": ShardSpec(completed=4)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)
    run.write_new("journal/shard-00001/started", b"")
    loc = RunMonitor(LocalStore(tmp_path)).run_state("syn", probe=False)["locations"][0]
    assert loc["generating"] == [{"shard_id": "shard-00001", "finished": 0, "prompts": 4}]
    assert loc["left"] == ["shard-00000"] and loc["remaining_prompts"] == 8


def test_a_retried_failure_counts_once_as_its_later_outcome(tmp_path) -> None:
    import json

    shards = {"shard-00000": ShardSpec(completed=3)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)

    def segment(name: str, records: list[dict]) -> None:
        run.write_new(f"journal/shard-00000/{name}",
                      b"".join(json.dumps(r).encode() + b"\n" for r in records))

    # A brownout journaled a retryable failure, a later segment the prompt's completion; a
    # too-long prompt's skip is final whatever follows.
    segment("000000.jsonl", [{"id": "a", "status": "failed", "reason": "http_5xx"},
                             {"id": "b", "status": "skipped", "reason": "prompt_too_long"}])
    segment("000001.jsonl", [{"id": "a", "status": "completed",
                              "timings": {"finished_at": T0 + 1},
                              "usage": {"completion_tokens": 5}, "server": "http://s0:1"},
                             {"id": "b", "status": "completed"}])
    loc = RunMonitor(LocalStore(tmp_path)).run_state("syn", now=T0 + 2,
                                                     probe=False)["locations"][0]
    assert loc["rows"] == {"completed": 1, "truncated": 0, "skipped": 1, "failed": 0}


def test_truncated_and_set_aside_rows_are_counted_apart_from_completed(tmp_path) -> None:
    # Issue 27: a run that failed its truncation gate showed its truncated, dropped rows as
    # "completed" and nothing else.
    run = LocalStore(tmp_path / "syn")
    shards = {"shard-00000": ShardSpec(completed=10, truncated=4, quarantined=3),
              "shard-00001": ShardSpec(completed=5, truncated=2, journal_only=True)}
    write_prompts_manifest(run, shards)
    for sid, spec in shards.items():
        write_shard(run, sid, spec)
    loc = RunMonitor(LocalStore(tmp_path)).run_state("syn", now=T0, probe=False)["locations"][0]
    assert loc["rows"] == {"completed": 15, "truncated": 6, "skipped": 0, "failed": 0}
    assert loc["tokenized_rows"] == {"written": 7, "quarantined": 3, "dropped": 0}


def test_a_finished_location_shows_its_average_over_the_time_it_generated(tmp_path,
                                                                          monkeypatch) -> None:
    # Issue 27: tokens/s fell to 0.0 when the last shard finished and stayed 0.0.
    from tests.unit.reporting import synthetic_run

    spans = iter([(T0, T0 + 10, 1000), (T0 + 5, T0 + 20, 2000), (T0 + 100, T0 + 110, 500)])
    build = synthetic_run.build_shard_output

    def with_generation(*args, **kwargs):
        data, manifest = build(*args, **kwargs)
        start, end, tokens = next(spans)
        manifest["generation"] = {"started_at": start, "finished_at": end,
                                  "output_tokens": tokens}
        return data, manifest

    monkeypatch.setattr(synthetic_run, "build_shard_output", with_generation)
    run = LocalStore(tmp_path / "syn")
    write_run(run, {f"shard-0000{i}": ShardSpec(completed=2) for i in range(3)})
    loc = RunMonitor(LocalStore(tmp_path)).run_state("syn", now=T0 + 500,
                                                     probe=False)["locations"][0]
    # 3,500 tokens over 20 s (two overlapping shards) + 10 s (a later one); the gap between
    # is no generation time.
    assert (loc["tokens_per_s"], loc["rate_basis"]) == (round(3500 / 30, 1), "average")


def test_the_generation_average_counts_overlapping_spans_once() -> None:
    assert generation_average([]) is None
    assert generation_average([(0.0, 10.0, 100), (2.0, 4.0, 100)]) == 20.0
    assert generation_average([(0.0, 10.0, 100), (20.0, 30.0, 100)]) == 10.0
    assert generation_average([(5.0, 5.0, 100)]) is None


# --- which keys the page serves ---------------------------------------------------------------
@pytest.mark.parametrize("key", [
    "small/report/manual__first_two/report.html",
    "small/report/manual__first_two/throughput.png",
    "small/report/scheduled__2026-01-01T00_00_00_00_00/report.json",
    "small/report/x/report.md",
    "small/regenerations/manual_1/report/manual_1/report.html",
    # A forced regeneration whose run id is "report" still has its report served.
    "small/regenerations/report/report/report/report.html",
])
def test_report_files_are_served(key) -> None:
    assert is_report_file(key)


@pytest.mark.parametrize("key", [
    # A forced regeneration with run id "report": its journals and outputs are not reports.
    "small/regenerations/report/journal/shard-00000/part-0001.jsonl",
    "small/regenerations/report/generated/shard-00000.manifest.json",
    "small/regenerations/report/tokenized/shard-00000.manifest.json",
    "small/regenerations/report/tokenized/report.json",
    # The run's own data.
    "small/prompts/manifest.json",
    "small/generated/shard-00000.jsonl",
    "small/journal/shard-00000/part-0001.jsonl",
    "small/report/journal/shard-00000.jsonl",
    # Not exactly <run>/report/<run id>/<file>.
    "report/x/report.html",
    "small/report/report.html",
    "small/report/x/y/report.html",
    "small/x/report/x/report.html",
    "a/small/report/x/report.html",
    "small/regenerations/report/report.html",
    # Extensions outside the report's, and names that leave or hide in a folder.
    "small/report/x/data.parquet",
    "small/report/x/conversations.jsonl",
    "small/report/x/report.html.bak",
    "small/report/x/REPORT.HTML",
    "small/report/../journal/report.html",
    "small/report/./report.html",
    "small/report/x/.report.html",
    "../small/report/x/report.html",
    "/small/report/x/report.html",
    "small//report/x/report.html",
    "small/report/x/report.html\n",
    "small/report/x/report.html/",
])
def test_everything_else_is_refused(key) -> None:
    assert not is_report_file(key)


def test_every_file_a_report_writes_is_served(tmp_path) -> None:
    from include.reporting import QualityGates, build_report

    shards = {"shard-00000": ShardSpec(completed=4)}
    run = LocalStore(tmp_path / "syn")
    write_prompts_manifest(run, shards)
    write_shard(run, "shard-00000", shards["shard-00000"])
    settings = run_settings({"run_name": "syn"}, output_root=str(tmp_path))
    build_report(settings, run, run, ["shard-00000"], [], run_id="manual__2026-01-01T00:00:00",
                 gates=QualityGates(max_quarantine_rate=1))
    written = [f"syn/{k}" for k in run.list("report/")]
    assert any(k.endswith(".png") for k in written) and any(k.endswith(".md") for k in written)
    assert [k for k in written if not is_report_file(k)] == []
    # ... and nothing else the run wrote is.
    assert [k for k in run.list("") if not k.startswith("report/")
            and is_report_file(f"syn/{k}")] == []


# --- what a request costs ---------------------------------------------------------------------
class CountingStore(LocalStore):
    """A local store that counts listings and reads."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.lists: list[str] = []
        self.children: list[str] = []
        self.reads: list[str] = []

    def list(self, prefix: str) -> list[str]:
        self.lists.append(prefix)
        return super().list(prefix)

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        self.children.append(prefix)
        return super().list_children(prefix)

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        return super().read(key)


def _two_runs(tmp_path) -> None:
    for name in ("one", "two"):
        shards = {"shard-00000": ShardSpec(completed=3), "shard-00001": ShardSpec(completed=3)}
        run = LocalStore(tmp_path / name)
        write_prompts_manifest(run, shards)
        write_shard(run, "shard-00000", shards["shard-00000"])
        write_shard(run, "shard-00001", ShardSpec(completed=3, journal_only=True))


def test_live_runs_lists_each_run_once_per_ttl_and_never_the_whole_store(tmp_path) -> None:
    _two_runs(tmp_path)
    clock = [0.0]
    store = CountingStore(tmp_path)
    monitor = RunMonitor(store, ttl_s=5.0, timer=lambda: clock[0])
    first = monitor.live_runs()
    assert [r["run_name"] for r in first] == ["one", "two"]
    # A folder at a time, never a recursive listing of the store or of a run.
    assert store.lists == [] and store.children
    # The root too, a folder level at a time (the runs), through the store's own listing.
    assert {p.split("/")[0] for p in store.children} == {"", "one", "two"}
    assert store.children.count("") == 1
    per_refresh, reads = len(store.children), len(store.reads)
    assert monitor.live_runs() == first  # a second request within the TTL costs nothing
    assert (len(store.children), len(store.reads)) == (per_refresh, reads)
    clock[0] = 6.0
    monitor.live_runs()
    assert len(store.children) == 2 * per_refresh and store.lists == []
    # Journal segments and manifests are create-only: parsed once, not again after the TTL.
    assert len(store.reads) == reads


def test_a_published_shards_journal_is_not_listed_again(tmp_path) -> None:
    store = CountingStore(tmp_path)
    run = LocalStore(tmp_path / "r")
    write_run(run, {"shard-00000": ShardSpec(completed=3),
                    "shard-00001": ShardSpec(completed=2, journal_only=True)})
    state = RunMonitor(store).run_state("r")
    assert state["locations"][0]["shards_running"] == 1 and state["locations"][0]["rows"][
        "completed"] == 5
    journal_folders = [p for p in store.children if "/journal/shard-" in p]
    assert journal_folders == ["r/journal/shard-00001/"]  # the one still generating


def test_servers_are_probed_once_per_ttl(tmp_path, monkeypatch) -> None:
    _two_runs(tmp_path)  # both runs' journals name the same two servers
    probed: list[str] = []
    monitor = RunMonitor(LocalStore(tmp_path), ttl_s=60.0, own_servers={("s0", 1), ("s1", 1)})
    monkeypatch.setattr(monitor, "_probe", lambda url: probed.append(url) or "healthy")
    monitor.live_runs()
    monitor.live_runs()
    assert sorted(probed) == ["http://s0:1", "http://s1:1"]


def test_journal_cache_is_bounded_in_records(tmp_path) -> None:
    _two_runs(tmp_path)
    monitor = RunMonitor(LocalStore(tmp_path), max_journal_records=4)
    for name in ("one", "two"):
        monitor.run_state(name, probe=False)
    assert 0 < monitor._parts.currsize <= 4
    # A segment bigger than the whole cache is read and counted, just not kept.
    small = RunMonitor(LocalStore(tmp_path), max_journal_records=1)
    state = small.run_state("one", probe=False)
    assert state["locations"][0]["rows"]["completed"] == 6 and small._parts.currsize == 0


def test_a_server_answering_health_after_sglangs_one_second_sleep_is_shown_healthy(
    tmp_path,
) -> None:
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class SlowHealth(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # like SGLang's /health: sleep 1 s, then look, then answer
            time.sleep(1.2)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowHealth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        # Asked for the old 1 s timeout, the probe still waits past SGLang's sleep.
        monitor = RunMonitor(LocalStore(tmp_path), probe_timeout_s=1.0,
                             own_servers={("127.0.0.1", server.server_address[1])})
        now = time.time()
        (shown,) = monitor._servers({url: now}, now, probe=True)
        assert shown["health"] == "healthy"
    finally:
        server.shutdown()
        server.server_close()


# --- only the deployment's own servers are probed ------------------------------------------
class _Counting(BaseHTTPRequestHandler):
    """Answer 200 to every GET and count them; or redirect to ``location`` when it is set."""

    hits: list[str]
    location: str | None = None

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(302 if self.location else 200)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def _http_server(location: str | None = None) -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits, "location": location})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_only_the_deployments_own_servers_are_probed(tmp_path) -> None:
    # A file the probe would read if a journal's file:// URL were opened.
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "health").write_text("private")
    with _http_server() as (ours, our_hits), _http_server() as (theirs, their_hits):
        port = int(ours.rsplit(":", 1)[1])
        monitor = RunMonitor(LocalStore(tmp_path), own_servers={("127.0.0.1", port)})
        listed = [ours, theirs, f"file://{tmp_path}/secret", f"http://u:p@127.0.0.1:{port}",
                  f"{ours}/v1", f"https://127.0.0.1:{port}", f"{ours}?x=1"]
        now = time.time()
        shown = {s["url"]: s["health"] for s in monitor._servers(dict.fromkeys(listed, now),
                                                                 now, probe=True)}
    assert shown.pop(ours) == "healthy" and our_hits == ["/health"]
    assert their_hits == []
    assert set(shown.values()) == {NOT_OURS}, shown  # every other URL: shown, never requested


def test_a_probe_follows_no_redirect_off_the_deployments_server(tmp_path) -> None:
    with _http_server() as (elsewhere, hits), _http_server(location=elsewhere + "/x") as (
            ours, _):
        port = int(ours.rsplit(":", 1)[1])
        monitor = RunMonitor(LocalStore(tmp_path), own_servers={("127.0.0.1", port)})
        now = time.time()
        (shown,) = monitor._servers({ours: now}, now, probe=True)
    assert shown["health"] == "HTTP 302" and hits == []  # answered, not followed, not healthy


def test_by_default_nothing_is_probed(tmp_path, monkeypatch) -> None:
    _two_runs(tmp_path)
    monitor = RunMonitor(LocalStore(tmp_path))
    monkeypatch.setattr(monitor, "_probe", lambda url: pytest.fail(f"probed {url}"))
    loc = monitor.live_runs()[0]["locations"][0]
    assert {s["health"] for s in loc["servers"]} == {NOT_OURS}


def test_the_deployments_server_addresses_cover_every_tp_size() -> None:
    from include.servers.launch_report import own_server_url, server_addresses
    from tests.fixtures.settings import deployment_settings

    d = deployment_settings(gpu_hosts=[{"host": "GPU-A", "gpus": [0, 1, 2, 3]}], port_base=31000)
    assert server_addresses(d) == {("gpu-a", 31000 + g) for g in range(4)}
    assert own_server_url("http://gpu-a:31002/", server_addresses(d)) == "http://gpu-a:31002"
    for url in ("http://gpu-a:31004", "file:///etc/passwd", "http://gpu-a", "gopher://gpu-a:31000",
                "http://gpu-a:99999", None):
        assert own_server_url(url, server_addresses(d)) is None


def test_a_conversations_turn_records_are_not_counted_as_prompts(tmp_path) -> None:
    from include.durability.journal import StoreJournal

    run = LocalStore(tmp_path / "r")
    write_run(run, {"shard-00000": ShardSpec(completed=2, journal_only=True)})
    journal = StoreJournal(run, "journal/shard-00000")
    for k in range(3):  # a conversation still going: three finished turns, no final record
        journal.append({"id": f"conv:1#turn-{k}@d{k}", "kind": "conversation_turn",
                        "status": "turn", "conversation_id": "conv:1", "turn": k,
                        "usage": {"completion_tokens": 50},
                        "timings": {"finished_at": T0 + 10 + k}})
    journal.close()
    (loc,) = RunMonitor(LocalStore(tmp_path)).run_state("r")["locations"]
    assert loc["rows"]["completed"] == 2
    assert loc["generating"] == [{"shard_id": "shard-00000", "finished": 2, "prompts": 2}]
