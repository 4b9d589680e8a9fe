"""Durability: what of a shard survives a crash, and one writer per shard.

The shard stage comes in through one door, ``door.ShardDurability``; ``journal`` (segments of
finished prompts, their merge rule) is also read by the engine, the report and the monitor.
Behind the door, private to it: ``lease`` (one lease generation and its heartbeat), ``claims``
(waiting for a turn), ``fencing`` (which segments count after a takeover), ``journal_settings``
(the completion settings a journal is written under; ``check_settings`` reads it too, before
any shard runs).

One writer per shard, the story every other module points to. Two runs can select the same
shard (a shard-range backfill beside the run, a re-trigger before the last run ended), and
two tries of one run can overlap (a zombie try and its retry). The journal keeps the output
exactly-once either way (records merge by prompt id), but both would spend GPU time on the
same prompts, and only one may publish. So each generating try holds the shard's lease:
generation N is taken by writing ``lease/<N>.json`` create-only (exactly one taker wins each
generation, so generations order the holders without a clock) and renewed by numbered
heartbeats (``lease``). A waiter takes the next generation only from a holder that released
it unfinished, stopped renewing, or finished but whose run ended unpublished (``claims``). A
holder counts itself lost before any waiter may take over, and then writes nothing more. The
generation is the fencing token: each segment's key, the generate summary and the published
manifest carry it; publishing refuses a token older than the newest generation; and each
generation records the segments it resumes from, so a late PUT of a paused old holder is
never read (``fencing``).
"""
