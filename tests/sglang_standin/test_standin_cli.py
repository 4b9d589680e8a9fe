"""The stand-in's `--config FILE.yaml`: SGLang's ConfigArgumentMerger semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_standin.cli import parse_args


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_config_file_options_apply_and_the_command_line_wins(tmp_path: Path) -> None:
    config = write(
        tmp_path / "server.yaml",
        'api-key: "yes"\ncontext-length: 4096\nenable-metrics: true\nserved-model-name: from-file\n'
        "standin-seed: 7\n",
    )
    c = parse_args(["--model-path", "/m", "--config", config, "--served-model-name", "from-cli"])
    assert c.api_key == "yes"  # quoted in YAML: text, not a boolean
    assert c.context_length == 4096 and c.enable_metrics and c.seed == 7
    assert c.served_model_name == "from-cli"
    # Before or after the other flags, the command line still wins.
    c = parse_args(["--config", config, "--context-length", "8192", "--model-path", "/m"])
    assert c.context_length == 8192 and c.api_key == "yes"


def test_false_switches_are_left_out_and_unknown_keys_are_ignored_like_flags(
    tmp_path: Path,
) -> None:
    config = write(tmp_path / "s.yml", "enable-metrics: false\ntrust-remote-code: true\n")
    c = parse_args(["--model-path", "/m", "--config", config])
    assert not c.enable_metrics
    assert c.ignored_args == ["--trust-remote-code", "true"]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("s.json", "{}", "Config file must be YAML format"),
        ("s.yaml", "- a\n- b\n", "dictionary at root level"),
        ("missing.yaml", None, "cannot read config file"),
    ],
)
def test_a_wrong_config_file_stops_the_program_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str | None, message: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--model-path", "/m", "--config", str(path)])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_one_config_file_at_most(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path / "s.yaml", "port: 1\n")
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--config", config, "--config", config])
    assert "Only one allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--config"])
    assert "No config file specified" in capsys.readouterr().err


def test_versions_default_to_v0_5_23_and_head_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    c = parse_args(["--model-path", "/m"])
    assert c.version == "v0.5.23" and c.effective_length_check == "v0.5.23"
    old = parse_args(["--model-path", "/m", "--standin-version", "v0.5.6"])
    assert old.effective_length_check == "v0.5.6"
    mixed = parse_args(["--model-path", "/m", "--standin-length-check", "v0.5.6"])
    assert mixed.version == "v0.5.23" and mixed.effective_length_check == "v0.5.6"
    for flag in ("--standin-version", "--standin-length-check"):
        with pytest.raises(SystemExit):
            parse_args(["--model-path", "/m", flag, "head"])
        assert "invalid choice: 'head'" in capsys.readouterr().err


def test_new_flags_parse_and_rates_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    c = parse_args(["--model-path", "/m"])
    assert (c.noncanonical_rate, c.load_seconds) == (0.0, 0.0)
    assert not c.enable_cache_report and not c.disable_radix_cache
    c = parse_args([
        "--model-path", "/m", "--standin-noncanonical-rate", "0.25", "--standin-load-seconds",
        "3", "--enable-cache-report", "--disable-radix-cache",
    ])  # fmt: skip
    assert (c.noncanonical_rate, c.load_seconds) == (0.25, 3.0)
    assert c.enable_cache_report and c.disable_radix_cache and not c.ignored_args
    assert c.sglang_args()["enable_cache_report"] is True
    assert c.standin_args()["standin_noncanonical_rate"] == 0.25
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--standin-noncanonical-rate", "1.5"])
    assert "a rate must be in [0, 1]" in capsys.readouterr().err


def test_the_server_args_line_has_each_releases_format() -> None:
    from sglang_standin.runtime import server_args_line

    new = server_args_line(parse_args(["--model-path", "/m", "--api-key", "k-1"]))
    assert new.startswith("server_args={'model_path': '/m', ") and "'api_key': 'k-1'" in new
    old = server_args_line(
        parse_args(["--model-path", "/m", "--api-key", "k-1", "--standin-version", "v0.5.6"])
    )
    assert old.startswith("server_args=ServerArgs(model_path='/m', ") and "api_key='k-1'" in old
