"""
### Regenerate speculative-decoding drafter training data with the target model

Prompts from six instruction datasets are extracted, filtered, deduplicated, sampled per
source and cut into shards; each shard is then answered by the target model on SGLang
servers, and the answers become the `input_ids` + `loss_mask` a drafter (DFlash, EAGLE-style)
trains on.

**Stages in this DAG now:** `prepare_prompts` (writes `prompts/shard-NNNNN.jsonl` and
`prompts/manifest.json` under `output_uri/run_name`, with the funnel of every source).

Every setting is a field of the trigger form; the same names work in
`airflow dags trigger -c '{"shard_size": 500}'` and are documented in `README.md`. A wrong
setting fails the first task before any work, naming the setting and the accepted values.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from include.settings import airflow_params


@dag(
    dag_id="regenerate_drafter_data",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    params=airflow_params(),
    tags=["speculative-decoding", "sglang", "data"],
)
def regenerate_drafter_data() -> None:
    @task
    def prepare_prompts(params: dict | None = None) -> list[str]:
        """Extract, filter, dedupe and shard the prompts; return the shard ids."""
        from include.prompts import prepare_prompts
        from include.settings import RunSettings

        settings = RunSettings.from_mapping(params)
        manifest = prepare_prompts(settings)
        return [shard["shard_id"] for shard in manifest["shards"]]

    prepare_prompts()


regenerate_drafter_data()
