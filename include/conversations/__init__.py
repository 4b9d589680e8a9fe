"""Whole conversations regenerated on-policy: the pure core (no I/O, no Airflow, no network).

Every function here takes plain data and returns plain data; the engine drives them (how:
``include.engine.conversing``'s docstring), the journal keeps their records and the tokenization
stage writes their rows (``include.tokenization.conversations``). One module each: ``chain``
(a conversation as a chain of requests, its end reasons), ``tools`` (which tool calls a turn
made, and whether the original's results may follow it), ``budget`` (the next turn's prompt
tokens and ``max_tokens``), ``rows`` (the whole-conversation row), ``resume`` (per-turn records
and the states a retry continues), ``affinity`` (which server takes a turn), ``records`` (a
finished conversation as one completion record).
"""
