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

How the engine drives it. Chains are sequential, the servers are not: the engine keeps its
adaptive window full with turns of many conversations, one turn per conversation at a time.

1. ``resume(journal records, {id: start(id, messages, call_format)})`` for the shard's
   conversations; the finished ones (``state.finished``) are done.
2. While conversations are waiting and a window has room: take a waiting conversation;
   ``next_request(state)`` gives the messages; ``turn_budget(state, count, ...)`` the
   ``max_tokens`` (with ``end_reason`` set: ``end_conversation(state, reason, detail)``,
   next conversation); ``choose_server(previous, views)`` the server
   (``previous`` = ``state.turns[-1].result.server``); send.
3. On a completion: ``state = after_turn(state, result)``; journal ``turn_record(state)``;
   if not ``state.finished`` the conversation waits again for its next turn. On a final
   failure (after ``engine.retry``): ``end_conversation(state, "failed", ...)``.
4. A conversation that ended is journaled once, as its final record
   (``records.conversation_record``: its turns and its end; ``end.retryable`` when a re-run
   could succeed); ``count_ends`` counts the ends for the summary. The tokenization stage
   checks each turn as the single-turn request it was, then writes ``rows.whole_row`` where
   the turns are prefix-stable, else the per-turn rows.
"""
