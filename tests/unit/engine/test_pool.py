"""The pool's server states: a misbehaving server rests with its work, a gone one is ejected."""

from __future__ import annotations

import asyncio

from include.engine import client as c
from include.engine.pool import PROBES_TO_EJECT, ServerPool


def _pool(cool_down_s: float = 60.0, window: int = 4) -> ServerPool:
    return ServerPool(["http://a", "http://b"], mode="fixed", start_window=window,
                      min_window=1, max_window=8, cool_down_after_failures=3, health_interval_s=1,
                      cool_down_s=cool_down_s, cool_down_max_s=120.0)


async def _in_flight(pool: ServerPool, server, n: int) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(asyncio.sleep(3600)) for _ in range(n)]
    for task in tasks:
        pool.dispatched(server)
        server.tasks.add(task)
    return tasks


def test_a_failure_streak_rests_the_server_and_keeps_its_in_flight_work() -> None:
    async def go() -> None:
        pool = _pool()
        a = pool.servers[0]
        tasks = await _in_flight(pool, a, 2)
        kinds = (c.ErrorKind.HTTP_5XX, c.ErrorKind.TIMEOUT, c.ErrorKind.QUEUE_FULL)
        for i, kind in enumerate(kinds):
            pool.record_failure(a, kind, "boom", f"p{i}", pool.dispatched(a))
        assert a.state == "resting" and a.free == 0 and a.healthy
        assert not any(t.cancelled() for t in tasks)
        assert pool.pick() is pool.servers[1]
        assert a.cool_downs == 1 and a.ejections == 0
        for t in tasks:
            t.cancel()
    asyncio.run(go())


def test_after_a_cool_down_one_trial_goes_and_a_success_ends_the_rest() -> None:
    async def go() -> None:
        pool = _pool(cool_down_s=0.0)
        a = pool.servers[0]
        old = pool.dispatched(a)  # sent before the streak, still in flight
        for i in range(3):
            pool.record_failure(a, c.ErrorKind.HTTP_5XX, "boom", f"p{i}", pool.dispatched(a))
        assert a.free == 1  # the cool-down is over: exactly one trial
        trial = pool.dispatched(a)
        assert a.trial and a.free == 0
        pool.record_failure(a, c.ErrorKind.HTTP_5XX, "boom", "p8", old)  # not the trial: no news
        assert a.cool_downs == 1 and a.free == 0
        # Trials are free.
        assert pool.record_failure(a, c.ErrorKind.HTTP_5XX, "boom", "p9", trial) is False
        assert a.cool_downs == 2 and a.cool_level == 2
        trial = pool.dispatched(a)
        a.in_flight = 0  # the engine's bookkeeping: every request above has come back
        pool.record_success(a, 10, trial)
        assert a.state == "in rotation" and a.free == a.window and a.cool_level == 0
    asyncio.run(go())


def test_a_request_sent_before_the_cool_down_cannot_end_it() -> None:
    async def go() -> None:
        pool = _pool()
        a = pool.servers[0]
        old = pool.dispatched(a)  # sent before the brownout, answered after it began
        for i in range(3):
            pool.record_failure(a, c.ErrorKind.QUEUE_FULL, "The request queue is full.", f"p{i}",
                                pool.dispatched(a))
        a.in_flight -= 1
        pool.record_success(a, 10, old)
        assert a.state == "resting" and a.completed == 1
    asyncio.run(go())


def test_only_failures_of_a_working_server_count_against_the_prompt() -> None:
    pool = _pool()
    a = pool.servers[0]

    def fails(kind: str, prompt: str) -> bool:
        return pool.record_failure(a, kind, "boom", prompt, pool.dispatched(a))

    assert fails(c.ErrorKind.HTTP_5XX, "poison") is True
    # The same prompt failing again alone: the prompt's fault (e.g. it crashes the server).
    assert fails(c.ErrorKind.HTTP_5XX, "poison") is True
    pool.record_success(a, 1, pool.dispatched(a))
    assert fails(c.ErrorKind.TIMEOUT, "p1") is True
    # A second prompt failing in the same streak: the server is failing everyone.
    assert fails(c.ErrorKind.TIMEOUT, "p2") is False
    assert fails(c.ErrorKind.TIMEOUT, "p1") is False


def test_requests_sent_before_a_brownout_do_not_end_its_streak() -> None:
    """A brownout: long requests sent before it still succeed while every new one gets 503.
    Those successes must not restart the streak, or each next failure would be charged to
    its prompt as if it had failed alone (seen: 4 of 378 prompts lost in a 30 s brownout)."""
    pool = _pool()
    a = pool.servers[0]
    old = [pool.dispatched(a) for _ in range(4)]
    charged = []
    for i, seq in enumerate(old[:2]):
        charged.append(pool.record_failure(a, c.ErrorKind.QUEUE_FULL, "full", f"p{i}",
                                           pool.dispatched(a)))
        pool.record_success(a, 100, seq)
    assert charged == [True, False]  # the first failure of a streak is the prompt's, once
    assert a.consecutive_failures == 2
    charged.append(pool.record_failure(a, c.ErrorKind.QUEUE_FULL, "full", "p2", pool.dispatched(a)))
    assert charged[-1] is False and a.state == "resting"
    # A request sent after the streak began and answered ends it, as before.
    b = pool.servers[1]
    pool.record_failure(b, c.ErrorKind.HTTP_5XX, "boom", "q0", pool.dispatched(b))
    pool.record_success(b, 1, pool.dispatched(b))
    assert b.consecutive_failures == 0


def test_connection_refused_ejects_at_once_and_takes_the_work_back() -> None:
    async def go() -> None:
        pool = _pool()
        a = pool.servers[0]
        tasks = await _in_flight(pool, a, 3)
        assert pool.record_failure(a, c.ErrorKind.CONNECT, "refused", "p0", 1) is False
        await asyncio.sleep(0)
        assert a.state == "ejected" and all(t.cancelled() for t in tasks)
    asyncio.run(go())


def test_failed_probes_rest_a_server_and_only_several_in_a_row_eject_it() -> None:
    async def go() -> None:
        pool = _pool()
        a = pool.servers[0]
        tasks = await _in_flight(pool, a, 2)
        for _ in range(PROBES_TO_EJECT - 1):
            pool.probe_result(a, ok=False, gone=False, detail="/health failed (TimeoutError)")
        assert a.state == "resting" and a.free == 0
        pool.probe_result(a, ok=True, gone=False, detail="/health answered 200")
        assert a.state == "in rotation" and not any(t.cancelled() for t in tasks)
        for _ in range(PROBES_TO_EJECT):
            pool.probe_result(a, ok=False, gone=False, detail="/health answered 503")
        await asyncio.sleep(0)
        assert a.state == "ejected" and all(t.cancelled() for t in tasks)
        pool.probe_result(a, ok=True, gone=False, detail="/health answered 200")
        assert a.state == "in rotation" and a.ejections == 1
    asyncio.run(go())


def test_a_refused_probe_ejects_at_once() -> None:
    pool = _pool()
    a = pool.servers[0]
    pool.probe_result(a, ok=False, gone=True, detail="/health refused the connection")
    assert a.state == "ejected"
