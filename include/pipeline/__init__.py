"""The front hall: one module per DAG task, each the whole of that task's body.

A task module binds the run's settings once (``run.bind``), opens its stores, asks Airflow
what it needs (``airflow_state``) and calls one stage below it (prompts, servers, generation,
tokenization, reporting). The stages never import this package nor Airflow (but the health
sensor/trigger pair and the hooks that wrap connections); ``tests/dag_validation/test_house.py``
holds the rule.
"""
