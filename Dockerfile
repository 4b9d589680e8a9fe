# Airflow image for the drafter-data DAG: the official image plus the project's pinned
# requirements. The code (dags/, include/, plugins/) is NOT baked in: docker-compose.yaml
# mounts it into every Airflow service, so a code change needs a restart, not a rebuild.
#
# The tag below must match the `apache-airflow==` pin in requirements.txt
# (tests/dag_validation/test_deployment_files.py checks it).
FROM apache/airflow:3.3.2-python3.11

# Install as the airflow user, as the official image expects (its pip refuses to run as root).
USER airflow
COPY --chown=airflow:0 requirements.txt /tmp/requirements.txt
# requirements.txt pins everything the deployment runs, the CeleryExecutor, FAB login and
# Postgres providers (and the Celery they work with) included: the native tier (`./dev up`)
# runs on exactly these pins. Test/dev-only tools (moto, pytest, pytest-timeout, ruff) are
# left out; their pinned dependencies stay listed and install harmlessly. requirements.txt
# pins apache-airflow==3.3.2 itself, so pip cannot move Airflow off the base image's version.
RUN grep -vE '^(moto|pytest|pytest-timeout|ruff)==' /tmp/requirements.txt > /tmp/requirements-runtime.txt \
    && pip install --no-cache-dir -r /tmp/requirements-runtime.txt \
    && rm /tmp/requirements.txt /tmp/requirements-runtime.txt
