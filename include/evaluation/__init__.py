"""Measuring a drafter on a dataset run's held-out split (issue 36): no Airflow here.

``split`` reads the run's ``eval/`` split, ``records`` turns one answer into the journaled
per-request record, ``measure`` sends the split and journals it (resumable), ``stats`` the
figures with their intervals, ``report`` the markdown, plot and dataset-card section,
``compat`` the drafter-against-target checks, ``settings`` the evaluation's settings.
"""
