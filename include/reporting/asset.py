"""The finished dataset's Asset name, URI and event extra, updated only by a passed run.

The DAG's run name is chosen at trigger time, so the dataset's URI is not known when the DAG
is parsed: the report task declares the static alias ``DATASET_ALIAS`` as its outlet and, on
pass, attaches an event for the run's dataset to it (``include.pipeline.report``, which builds
the Airflow ``Asset`` from these names). A run that fails its gates raises before that, and a
failed task emits no asset event at all.
"""

from __future__ import annotations

import os
from typing import Any

#: The report task's outlet; a training DAG may schedule on it (every dataset) or on
#: ``Asset(dataset_asset_uri(settings))`` (one run name's dataset).
DATASET_ALIAS = "regenerated_drafter_data"


def dataset_asset_uri(settings: Any) -> str:
    """Return the URI of a run's finished dataset, ``<run location>/tokenized``: the run's, not
    one Airflow run's, so a backfill or a forced regeneration updates the same asset."""
    base = settings.run_uri
    if base.startswith("s3://"):
        return base.rstrip("/") + "/tokenized"
    return "file://" + os.path.abspath(base) + "/tokenized"


def dataset_asset_name(settings: Any) -> str:
    """Return the Asset name of a run's dataset (``drafter_data/<run_name>``)."""
    return f"drafter_data/{settings.run_name}"


def asset_event_extra(summary: dict[str, Any]) -> dict[str, Any]:
    """Return the asset event's extra: where the outputs and report are, and the counts."""
    run = summary["run"]
    return {
        "run_name": run["run_name"],
        "airflow_run_id": run["airflow_run_id"],
        "outputs_uri": run["outputs_uri"],
        "report_uri": summary["report_uri"],
        "shards_produced": summary["shards_produced"],
        "shards_reused": summary["shards_reused"],
        "samples": summary["tokenized"]["written"],
        "tokens": summary["tokenized"]["tokens"],
    }
