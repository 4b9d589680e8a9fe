"""Whole conversations regenerated on-policy: the pure core (no I/O, no Airflow, no network).

Every function here takes plain data and returns plain data; the generation engine, the
journal and the tokenization stage carry out what they decide.

=================  ==========================================================================
module             decides
=================  ==========================================================================
``chain``          a conversation as a chain of requests: ``start``, ``next_request``,
                   ``after_turn``, ``end_conversation``; end reasons and their counts
``tools``          which tool calls (or agent actions) a turn made, and whether a regenerated
                   turn made the original's, so the recorded results may follow it
``budget``         the next turn's estimated prompt tokens and ``max_tokens``; a turn that
                   cannot fit ends its conversation ``context_exhausted``
``rows``           the whole-conversation row where the turns are prefix-stable (else where
                   they first differ); the tokenization stage writes it with ``whole_row``
``resume``         the journal records of finished turns, and the states a retry continues
``affinity``       which server takes a turn: the one holding the history, unless it rests,
                   is gone or is far busier (and why it moved)
=================  ==========================================================================

The engine drives them (how: ``include.engine.conversing``'s docstring); the tokenization stage
writes their rows (``include.tokenization.conversations``).
"""
