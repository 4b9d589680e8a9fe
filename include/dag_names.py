"""The DAGs' ids and the task ids read from outside a task (in a leaf: no imports).

The DAG files, the pipeline, the monitor, the run-note plugin and the scripts all name these;
one spelling here keeps a rename from leaving one of them reading a task that no longer exists
(``tests/dag_validation/test_dag_integrity.py`` checks them against the parsed DAG).
"""

from __future__ import annotations

#: The main DAG (``dags/regenerate_drafter_data.py``).
DAG_ID = "regenerate_drafter_data"
#: The task whose return value is a run's plan, one ``{"shard_id", "outputs_uri", ...}`` per
#: map index of the shard tasks; it also leaves the ``nothing_to_do`` sentence in XCom.
PLAN_TASK = "prepare_prompts"
#: The mapped task group's tasks, in the order each shard runs them.
SHARD_GROUP = "shard"
GENERATE_TASK = f"{SHARD_GROUP}.generate"
UPLOAD_TASK = f"{SHARD_GROUP}.upload"
TOKENIZE_TASK = f"{SHARD_GROUP}.tokenize"
SHARD_TASKS = (GENERATE_TASK, UPLOAD_TASK, TOKENIZE_TASK)
#: The held-out split's map index name among the shard tasks (its shard id is a shard's).
HELD_OUT_NAME = "held-out"
