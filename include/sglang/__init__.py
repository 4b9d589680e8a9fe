"""Every HTTP call this project makes to an SGLang server, in one place.

* ``contract``: the endpoints, the ``/health`` timeout floor, and pure parses of SGLang's
  answers (``/v1/models``' ``max_model_len``, ``/server_info``'s version). No I/O.
* ``sync``: the same calls over ``urllib`` (the launcher, the monitor page).
* ``aio``: the same calls over ``aiohttp`` (the engine's pool, preflight, the health trigger).

A leaf package: it imports nothing from ``include`` outside itself and never Airflow, so any
stage may use it. This file imports nothing, so ``include.sglang.contract`` and
``include.sglang.sync`` load without aiohttp (the DAG file's parse must not import it).
"""
