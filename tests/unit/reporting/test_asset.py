"""The dataset asset's URI: the run's tokenized prefix (the asset and its event, made by the
report task, are tested in ``tests/unit/pipeline/test_report.py``)."""

from __future__ import annotations

from include.reporting import dataset_asset_uri
from include.settings import RunSettings
from tests.fixtures.settings import run_settings


def _settings(output_root: str, run_name: str = "expansion_v1") -> RunSettings:
    return run_settings({"run_name": run_name}, output_root=output_root)


def test_uri_of_an_s3_run_is_its_tokenized_prefix() -> None:
    assert dataset_asset_uri(_settings("s3://bucket/runs/")) == (
        "s3://bucket/runs/expansion_v1/tokenized")


def test_uri_of_a_local_run_is_an_absolute_file_uri(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert dataset_asset_uri(_settings("out", "v2")) == f"file://{tmp_path}/out/v2/tokenized"
