"""
### Measure drafters on a dataset run's held-out split (acceptance, per source and thinking mode)

Every dataset run keeps a held-out split (`eval/prompts/shard-00000.jsonl`, in no training
export). This DAG serves the target with SGLang's speculative decoding, once per drafter
configuration (the baseline, each candidate) and once alone, sends the split with per-request
spec details, and reports SGLang's acceptance length (bonus token counted) and acceptance
rate per drafter x source x thinking mode, with intervals, the candidates' differences from
the baseline and the speedup over the target alone.

```
check_settings
└─ launch_servers (setup: every configuration on its own share of the servers)
   └─ health_targets
      └─ wait_for_server[host:port] (mapped: the main DAG's health gate)
         └─ measure[config] (mapped: journaled, resumable)
            ├─ report (markdown, plot, json, card section; the evaluations' asset)
            │  └─ gate (min_gain)
            └─ stop_servers (teardown: runs whatever happened)
```
* **check_settings** refuses, before any server starts, every mistake known in advance: a
  drafter the deployment does not list (`REGEN_ALLOWED_DRAFTERS`), one whose `config.json`
  does not fit the target, a dataset run without a held-out split, a named prompt set the
  deployment does not list (`REGEN_ALLOWED_PROMPT_SETS`) or whose file is outside the data
  roots, missing or malformed, too few servers for the configurations. An empty
  `dataset_run` means the dataset asset's latest run.
* **launch_servers** starts (or reuses, only when model, context length *and* speculative
  settings match) each configuration's servers through the main DAG's launcher; the draft
  path comes from the deployment, never from the form. **wait_for_server** is the main DAG's
  gate.
* **measure** checks each server's `/server_info` runs its pass's speculation, then sends the
  split and the named prompt sets (`prompt_sets`: MT-Bench, GSM8K, HumanEval files the
  deployment lists; reported as sources of their own, never pooled with the run's data)
  under every temperature and thinking mode, journaling each request under
  `<dataset run>/eval/evaluations/<run id>/journal/<config>/`: a retry sends only the rest.
* **report** writes `report.md`, `acceptance.png`, `report.json` and the dataset card's
  "measured value" section (`card-section.md`) create-only beside them, and updates the
  asset alias `drafter_evaluations` (a promotion DAG can be scheduled on it; its extra holds
  the gains and the gate's verdict). **gate** fails the run when a candidate gains less
  than `min_gain` acceptance length over the baseline, naming the figures.
* **stop_servers** stops only what this run started, whatever happened to the run.

See docs/evaluation.md.
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
    teardown,
)

from include.evaluation.keys import EVALUATION_ALIAS
from include.pipeline.evaluate_form import airflow_params
from include.pipeline.evaluate_servers import EvaluationHealthSensor
from include.reporting.asset import DATASET_ALIAS
from include.settings.deployment import DeploymentSettings
from include.settings.errors import TaskRefused

DAG_ID = "evaluate_drafter"
#: Wait for servers in the triggerer (environment only, as the main DAG reads it).
DEFER_HEALTH_GATE = DeploymentSettings.parse_time_values().defer_health_gate
#: As the main DAG's: every task re-runnable (journal, create-only writes, idempotent launch);
#: a refusal fails at once, its reason without a traceback.
DEFAULT_ARGS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "execution_timeout": timedelta(hours=6),
    "show_return_value_in_logs": False,
    "retry_policy": ExceptionRetryPolicy(rules=[RetryRule(
        exception=TaskRefused, action=RetryAction.FAIL,
        reason="refused (the reason is above): a retry would refuse the same")]),
}


# Each task body is one call into include/pipeline/evaluate_*.py, imported when the task runs.
@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    default_args=DEFAULT_ARGS,
    params=airflow_params(),
    tags=["speculative-decoding", "sglang", "evaluation"],
)
def evaluate_drafter() -> None:
    @task(retries=0, execution_timeout=timedelta(minutes=10),
          inlets=[AssetAlias(DATASET_ALIAS)])
    def check_settings(params: dict | None = None, inlet_events=None) -> list[dict]:
        """Refuse every mistake before a server starts; return one entry per configuration:
        ``{"config", "dataset_run"}`` (the dataset run resolved once, here)."""
        from include.pipeline.evaluate_check import run

        return run(params, inlet_events)

    @setup
    def launch_servers(checked: list[dict], params: dict | None = None,
                       run_id: str | None = None) -> dict:
        """Start (or reuse) each configuration's servers with its speculative flags."""
        from include.pipeline.evaluate_servers import launch

        return launch(checked, params, DAG_ID, run_id)

    @task
    def health_targets(launched: dict, params: dict | None = None) -> list[dict]:
        """Fail on servers that cannot serve their pass; return each server's identifier."""
        from include.pipeline.evaluate_servers import targets

        return targets(launched, params)

    @task(map_index_template="{{ task.op_kwargs['config'] }}")
    def measure(config: str, dataset_run: str, params: dict | None = None,
                run_id: str | None = None) -> dict:
        """Send the held-out split to this configuration's servers, journaled (resumable)."""
        from include.pipeline.evaluate_measure import run

        return run(config, dataset_run, params, run_id)

    @task(outlets=[AssetAlias(EVALUATION_ALIAS)], retries=0)
    def report(checked: list[dict], measured: list[dict], params: dict | None = None,
               run_id: str | None = None, outlet_events=None) -> dict:
        """Write the report, plot, json and card section; update the evaluations' asset."""
        from include.pipeline.evaluate_report import run

        return run(checked, params, run_id, outlet_events)

    @task(retries=0)
    def gate(summary: dict, params: dict | None = None) -> None:
        """Fail when a candidate's gain over the baseline is below min_gain."""
        from include.pipeline.evaluate_report import gate

        gate(summary, params)

    @teardown(on_failure_fail_dagrun=True)
    def stop_servers(launched: dict, params: dict | None = None,
                     run_id: str | None = None) -> None:
        """Stop exactly the servers this run started and confirm they are gone."""
        from include.pipeline.evaluate_servers import stop

        stop(launched, params, DAG_ID, run_id)

    checked = check_settings()
    launched = launch_servers(checked)
    waited = EvaluationHealthSensor.partial(
        task_id="wait_for_server", deferrable=DEFER_HEALTH_GATE, poke_interval=2, retries=0,
        map_index_template="{{ task.server['host'] }}:{{ task.server['port'] }}",
    ).expand(server=health_targets(launched))
    measured = measure.expand_kwargs(checked)
    waited >> measured
    # The report is a leaf's parent beside the teardown (as in the main DAG): a run whose
    # only leaf were a successful teardown would be marked successful with a failed gate.
    measured >> [gate(report(checked, measured)), stop_servers(launched)]


evaluate_drafter()
