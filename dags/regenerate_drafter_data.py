"""
### Regenerate speculative-decoding drafter training data with the target model

Prompts from six instruction datasets are extracted, filtered, deduplicated, sampled per
source and cut into shards; each shard is answered by the target model on SGLang servers
(one per GPU), and the answers become the `input_ids` + `loss_mask` a drafter (DFlash,
EAGLE-style) trains on.

```
check_settings
└─ prepare_prompts
   └─ launch_servers (setup)
      └─ health_targets
         └─ wait_for_server[host:port] (mapped: one deferrable sensor per server)
            └─ preflight
               └─ shard[shard-NNNNN] (mapped, depth-first): generate ─ upload ─ tokenize
                  ├─ report (quality gates, dataset asset)
                  └─ stop_servers (teardown)
```
* **check_settings** refuses, in seconds and before any work, every mistake that can be known
  in advance (each setting, value and what is accepted); nothing is prepared or launched.
* **prepare_prompts** writes `prompts/shard-NNNNN.jsonl` + `prompts/manifest.json` under
  `<output root>/<run_name>` (or reuses them when they exist with the same preparation
  settings), and picks the shards left to generate.
* **launch_servers** starts one SGLang server per GPU over SSH (reusing servers that already
  serve this model), only once the prompts are ready and only if a shard is left to generate;
  **wait_for_server** gates on `/health` and on the model name and
  context length each server reports; **preflight** sends the run's longest prompt to each.
* **shard** runs once per shard: generate (journaled, resumable), upload (create-only,
  checksummed), tokenize (checked masks); once more, named `held-out`, for the run's held-out
  split, whose answers land in `eval/` beside its prompts, in no training export.
* **report** writes `report/<run id>/` (funnel, throughput, lengths, plots), fails the run on
  a broken quality gate, and otherwise updates the dataset asset (alias
  `regenerated_drafter_data`) a training DAG can be scheduled on.
* **stop_servers** stops only what this run started, whatever happened to the run.

Servers cross XCom as identifiers (host and port) only: every task rebuilds a server's SSH
connection, command prefix, log directory and URL from the deployment settings and refuses an
identifier the deployment does not list (XCom can be edited over the REST API). Likewise a
shard's outputs go where the run's settings and run id put them; the plan's `outputs_uri` is
only compared with that location, and any other is refused before a byte is written.

The trigger form holds the *run settings* (what a run does); the same names work in
`airflow dags trigger regenerate_drafter_data -c '{"shard_range": "120-179"}'`. Hosts, commands,
credentials, the output root and protected prefixes are *deployment settings* (`REGEN_*`
environment variables), never in the form. See README.md.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import (
    AssetAlias,
    ExceptionRetryPolicy,
    RetryAction,
    RetryRule,
    dag,
    setup,
    task,
    task_group,
    teardown,
)

from include.dag_names import DAG_ID, HELD_OUT_NAME
from include.reporting.asset import DATASET_ALIAS
from include.servers.sensor import ServerHealthSensor
from include.settings.deployment import DeploymentSettings
from include.settings.errors import TaskRefused
from include.settings.params import airflow_params

# The two deployment settings that are task arguments, hence read when the file is parsed
# (environment only: no connection, no network).
_PARSED = DeploymentSettings.parse_time_values()
#: Shards generated at once per run; they share the servers, so one shard's drain overlaps
#: the next one's start.
MAX_ACTIVE_SHARDS = _PARSED.max_active_shards
#: Shards whose generate task starts before a slot frees: set up (DAG parsed, tokenizer and
#: prompts loaded) and waiting, so a freed slot's next shard sends its first request within a
#: second, not after the scheduler, Celery and the task's start-up (5 s; 14 s on a loaded
#: worker). Two cover a start-up longer than the time between two shards ending (short
#: shards, a busy worker); each holds a worker slot while it waits.
SHARDS_QUEUED_AHEAD = 2
#: Wait for servers in the triggerer (no worker slot held while a model loads).
DEFER_HEALTH_GATE = _PARSED.defer_health_gate

#: Every task is re-runnable (journal, create-only writes, idempotent launch), so a task lost
#: with its worker is retried, on any worker, and resumes where it stopped.
DEFAULT_ARGS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": timedelta(hours=2),
    # Tasks log what they did in words; their return values (plans, reports) are for XCom.
    "show_return_value_in_logs": False,
    # A refusal (a wrong setting, a failed quality gate: include/pipeline/refusal.py) fails at
    # once, its reason with no traceback under it; any other failure is retried as above.
    "retry_policy": ExceptionRetryPolicy(rules=[RetryRule(
        exception=TaskRefused, action=RetryAction.FAIL,
        reason="refused (the reason is above): a retry would refuse the same")]),
}
#: A mapped shard task's name in the grid, from its own arguments: shown as soon as the task
#: starts (a name set inside the task body would only show once the task finished).
# The held-out split is shard-00000 of the run's eval/ folder: named apart from shard-00000.
SHARD_NAME = (f"{{{{ '{HELD_OUT_NAME}' if task.op_kwargs.get('split') == 'held_out' "
              "else task.op_kwargs['shard_id'] }}")
#: A shard of 1,000 prompts with thinking takes ~10-40 minutes on eight busy GPUs.
SHARD_TIMEOUT = timedelta(hours=6)


# Each task body is one call into include/pipeline/<task>.py, imported when the task runs.
@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    params=airflow_params(),
    tags=["speculative-decoding", "sglang", "data"],
)
def regenerate_drafter_data() -> None:
    @task(retries=0, execution_timeout=timedelta(minutes=10))
    def check_settings(params: dict | None = None) -> None:
        """Fail before any work if a setting is wrong; log the resolved settings."""
        from include.pipeline.check_settings import run

        run(params)

    @task
    def prepare_prompts(params: dict | None = None, run_id: str | None = None) -> list[dict]:
        """Extract, filter, dedupe and shard the prompts (or reuse them); plan the shards."""
        from include.pipeline.prepare_prompts import run

        return run(params, run_id, MAX_ACTIVE_SHARDS)

    @setup
    def launch_servers(plan: list[dict], params: dict | None = None,
                       run_id: str | None = None) -> dict:
        """Start (or reuse) one server per GPU if a shard is left; return what was started."""
        from include.pipeline.launch_servers import run

        return run(plan, params, DAG_ID, run_id)

    @task
    def health_targets(report: dict, params: dict | None = None) -> list[dict]:
        """Fail on servers that cannot serve this run; return each server's identifier."""
        from include.pipeline.health_targets import run

        return run(report, params)

    @task
    def preflight(report: dict, plan: list[dict], params: dict | None = None) -> list[dict]:
        """Send the run's longest prompt to every server; return the servers' identifiers."""
        from include.pipeline.preflight import run

        return run(report, plan, params)

    @task_group(group_id="shard")
    def per_shard(shard_id: str, servers: list[dict], outputs_uri: str,
                  wait_for: dict | None, split: str = "train") -> None:
        @task(max_active_tis_per_dagrun=MAX_ACTIVE_SHARDS + SHARDS_QUEUED_AHEAD,
              execution_timeout=SHARD_TIMEOUT, map_index_template=SHARD_NAME)
        def generate(shard_id: str, servers: list[dict], outputs_uri: str,
                     wait_for: dict | None, split: str = "train",
                     params: dict | None = None,
                     run_id: str | None = None, ti=None) -> dict:
            """Generate the shard's completions into its journal, one writer at a time."""
            from include.pipeline.generate import run

            return run(shard_id, servers, outputs_uri, wait_for, params, dag_id=DAG_ID,
                       run_id=run_id, ti=ti, slots=MAX_ACTIVE_SHARDS, split=split)

        @task(map_index_template=SHARD_NAME)
        def upload(shard_id: str, generated: dict, outputs_uri: str, split: str = "train",
                   params: dict | None = None, run_id: str | None = None) -> str:
            """Publish the shard's completions create-only, with checksums."""
            from include.pipeline.upload import run

            return run(shard_id, generated, outputs_uri, params, run_id, split)

        @task(map_index_template=SHARD_NAME)
        def tokenize(shard_id: str, outputs_uri: str, split: str = "train",
                     params: dict | None = None, run_id: str | None = None) -> str:
            """Tokenize the shard into input_ids + loss_mask, checked token by token."""
            from include.pipeline.tokenize import run

            return run(shard_id, outputs_uri, params, run_id, split)

        # Keyword arguments: the shard names in the grid (SHARD_NAME) read them by name.
        generated = generate(shard_id=shard_id, servers=servers, outputs_uri=outputs_uri,
                             wait_for=wait_for, split=split)
        uploaded = upload(shard_id=shard_id, generated=generated, outputs_uri=outputs_uri,
                          split=split)
        tokenize(shard_id=uploaded, outputs_uri=outputs_uri, split=split)

    @task(outlets=[AssetAlias(DATASET_ALIAS)], retries=0)
    def report(plan: list[dict], launched: dict, params: dict | None = None,
               run_id: str | None = None, outlet_events=None) -> dict:
        """Write the run report; fail on a broken quality gate, else update the dataset asset."""
        from include.pipeline.report import run

        return run(plan, launched, params, run_id, outlet_events)

    @teardown(on_failure_fail_dagrun=True)
    def stop_servers(report: dict, params: dict | None = None, run_id: str | None = None
                     ) -> None:
        """Stop exactly the servers this run started and confirm they are gone."""
        from include.pipeline.stop_servers import run

        run(report, params, DAG_ID, run_id)

    plan = prepare_prompts()
    check_settings() >> plan
    launched = launch_servers(plan)
    waited = ServerHealthSensor.partial(
        task_id="wait_for_server", deferrable=DEFER_HEALTH_GATE, poke_interval=2,
        # A failed gate (process exited, wrong model or context length, launch timeout) is not
        # helped by waiting again: the server is not relaunched by a retry of its gate.
        retries=0,
        map_index_template="{{ task.server['host'] }}:{{ task.server['port'] }}",
    ).expand(server=health_targets(launched))
    servers = preflight(launched, plan)
    waited >> servers
    shards = per_shard.partial(servers=servers).expand_kwargs(plan)
    # The report is a leaf beside the teardown, not upstream of it: Airflow decides a run's
    # state from its leaves, and a run whose only leaf is a successful teardown is marked
    # successful even when shards failed and the report never ran.
    shards >> [report(plan, launched), stop_servers(launched)]


regenerate_drafter_data()
