"""A test run says per tier what runs, how long it takes and what skips (tests/fixtures/tiers.py).

Run as a user runs it: a ``-q`` pytest process over a tiny selection, its output read.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures import tiers

ROOT = Path(__file__).resolve().parents[2]


def _pytest(*args: str, cwd: Path = ROOT) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_a_quiet_run_names_each_tier_its_count_and_typical_time_first_and_last() -> None:
    out = _pytest("tests/dag_validation/test_pipeline_pictures.py",
                  "tests/sglang_standin/test_standin_radix.py")
    known = tiers.readme_tiers()
    header, _, rest = out.partition("==> ")
    assert f"tests/dag_validation/: 4 tests, typically {known['tests/dag_validation'][1]}" \
        in header
    assert "tests/sglang_standin/: " in header and known["tests/sglang_standin"][1] in header
    assert "==> tests/sglang_standin/" in rest  # said again as the tier starts
    summary = out.split("per tier")[1]
    assert "tests/dag_validation/: 4 passed in " in summary
    assert "(typically ~15 s)" in summary


def test_the_summary_groups_a_tier_s_skips_by_reason(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "def test_runs(): pass\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_needs_a_browser(n): pytest.skip('chromium is not installed')\n")
    out = _pytest("-p", "tests.fixtures.tiers", "test_some.py", cwd=tmp_path)
    summary = out.split("per tier")[1]
    assert "1 passed, 2 skipped in" in summary
    assert "2 skipped: chromium is not installed" in summary


def test_a_missing_prerequisite_is_named_with_the_tests_it_skips(monkeypatch) -> None:
    absent = tiers.Prerequisite(("chromium",), "a browser", lambda: False)
    monkeypatch.setitem(tiers.PREREQUISITES, "chromium", absent)
    items = [SimpleNamespace(path=ROOT / "tests/integration/plugins/test_monitor_page.py")] * 3
    lines = tiers.TierReport(config=None).pytest_report_collectionfinish(items)
    assert lines[1].startswith("  tests/integration/: 3 tests, typically ")
    assert lines[2].strip().startswith("missing chromium (Debian chromium, a browser): the "
                                       "browser checks of the monitor page and the trigger "
                                       "form skip")
    assert tiers.missing_lines(["tests/integration", "-q"])[-1] == \
        "chromium\ta browser\ttests/integration"
    assert tiers.missing_lines(["tests/unit"]) == []


@pytest.mark.parametrize(("args", "expected"), [
    ([], [t.path for t in tiers.TIERS]),
    (["-q", "--durations=8", "tests/unit/pipeline", "tests/integration/test_pipeline.py::t"],
     ["tests/unit", "tests/integration"]),
    (["tests", "-m", "not deployment"],
     [t.path for t in tiers.TIERS if t.path != "tests/deployment"]),
    (["tests/deployment", "-p", "no:cacheprovider"], ["tests/deployment"]),
])
def test_the_tiers_a_command_line_selects(args, expected) -> None:
    assert [t.path for t in tiers.selected_tiers(args)] == expected


def test_every_tier_has_a_row_in_the_readme_and_every_row_a_tier() -> None:
    assert set(tiers.readme_tiers()) == {t.path for t in tiers.TIERS}
