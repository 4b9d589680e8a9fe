# Airflow image for the drafter-data DAG: the official image plus the project's pinned
# requirements. The code (dags/, include/, plugins/) is NOT baked in: docker-compose.yaml
# mounts it into every Airflow service, so a code change needs a restart, not a rebuild.
#
# The tag below must match the `apache-airflow==` pin in requirements.txt
# (tests/dag_validation/test_deployment_files.py checks it).
FROM apache/airflow:3.3.2-python3.11

# Providers the compose deployment needs that the DAG itself does not import (so they are not
# in requirements.txt): the CeleryExecutor, FAB login for the UI, the Postgres metadata
# database. The base image ships them already; they are pinned here so that installing
# requirements.txt cannot leave them at a version that disagrees with its pins. These versions
# resolved together with every pin of requirements.txt (uv pip compile, 2026-11-30).
ARG DEPLOYMENT_PROVIDERS="apache-airflow-providers-celery==3.26.0 apache-airflow-providers-fab==3.10.2 apache-airflow-providers-postgres==7.1.1"

# Install as the airflow user, as the official image expects (its pip refuses to run as root).
USER airflow
COPY --chown=airflow:0 requirements.txt /tmp/requirements.txt
# Test/dev-only tools (moto, pytest, pytest-timeout, ruff) are left out; their pinned
# dependencies stay listed and install harmlessly. requirements.txt pins apache-airflow==3.3.2
# itself, so pip cannot move Airflow off the base image's version.
RUN grep -vE '^(moto|pytest|pytest-timeout|ruff)==' /tmp/requirements.txt > /tmp/requirements-runtime.txt \
    && pip install --no-cache-dir -r /tmp/requirements-runtime.txt ${DEPLOYMENT_PROVIDERS} \
    && rm /tmp/requirements.txt /tmp/requirements-runtime.txt
