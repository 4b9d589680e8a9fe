"""Measuring a drafter on a dataset run's held-out split (issue 36): no Airflow here.

``split`` reads the run's ``eval/`` split, ``prompt_sets`` the deployment's named prompt sets
(MT-Bench, GSM8K, HumanEval files) measured beside it, ``records`` turns one answer into the
journaled per-request record, ``measure`` sends the prompts and journals them (resumable),
``stats`` the figures with their intervals, ``report`` the markdown, plot and dataset-card
section, ``compat`` the drafter-against-target checks, ``settings`` the evaluation's settings.
"""
