"""A plugin batch of requests goes to MQ in one unit of work (request_batches.py), and
whatever needs a request's own outcome falls back to one request per unit of work
without sending any request twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.port import MQError
from gateway.plugin_api import Envelope
from gateway.runtime.request_reply import request_batches
from gateway.runtime.request_reply.service import RequestReplyService
from gateway.wire.reasons import Reason
from plugins.memory import get_bus
from tests.network.network_helpers import drain
from tests.runtime.request_reply.conftest import Gateway, echo
from tests.support.exchanges import started_memory


def _route(**over: object) -> dict[str, object]:
    return {"name": "quote", "plugin": "req", "source": "quote/req",
            "destination": "SVC.QUOTE", "timeout": 15.0, **over}


def _request(n: int, payload: bytes | None = None) -> Envelope:
    return Envelope("", "quote/req", payload if payload is not None else b"q%d" % n,
                    reply_topic="answers", correlation_data=b"c-%d" % n)


async def _started(gw: Gateway, bus: str) -> RequestReplyService:
    """The service with a memory instance whose handler the test drives directly."""
    svc = await gw.start()
    gw.instances["req"] = inst = await started_memory("req", bus)
    svc.attach("req", inst)
    return svc


def _count_commits(svc: RequestReplyService) -> list[int]:
    """Counts the MQ commits of the connections the service opens from now on."""
    commits = [0]

    def count(conn: Any) -> None:
        commit = conn.commit

        async def counted(*args: Any, **kwargs: Any) -> None:
            commits[0] += 1
            await commit(*args, **kwargs)

        conn.commit = counted

    _wrap_connections(svc, count)
    return commits


def _wrap_connections(svc: RequestReplyService, wrap: Callable[[Any], None]) -> None:
    """``wrap`` changes each connection the service opens from now on."""
    qm: Any = svc.qm
    connect = qm.connect

    async def wrapped() -> Any:
        conn = await connect()
        wrap(conn)
        return conn

    qm.connect = wrapped


async def test_a_batch_of_requests_is_one_unit_of_work_and_every_request_is_answered(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb1")
    commits = _count_commits(svc)
    batch = [_request(n) for n in range(5)]
    await svc.on_requests(svc.requests["quote"], batch)
    assert commits[0] == 1
    # a redelivery of the whole batch (the source crashed before its ack), before any
    # reply, puts nothing: each request was marked sent
    await svc.on_requests(svc.requests["quote"], batch)
    assert svc.stats()["duplicates_filtered"] == 5
    got = await echo(net["QMA"].qm, "SVC.QUOTE", 5)
    assert [m.body for m in got] == [b"q%d" % n for n in range(5)]  # in the batch's order
    replies = await get_bus("rb1").exchanges.wait_on("answers", 5, timeout=20)
    assert sorted(r.correlation_data for r in replies) == [b"c-%d" % n for n in range(5)]
    assert svc.stats()["requests_sent"] == 5
    assert await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=200) == []


async def test_a_large_batch_is_sent_in_units_of_the_limit_in_order(
    net: Network, gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(request_batches, "MAX_REQUESTS_PER_UNIT", 2)
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb2")
    commits = _count_commits(svc)
    await svc.on_requests(svc.requests["quote"], [_request(n) for n in range(5)])
    assert commits[0] == 3
    got = await echo(net["QMA"].qm, "SVC.QUOTE", 5)
    assert [m.body for m in got] == [b"q%d" % n for n in range(5)]
    assert svc.stats()["requests_sent"] == 5


async def test_one_request_twice_in_a_batch_is_put_once(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb3")
    await svc.on_requests(svc.requests["quote"], [_request(0), _request(1), _request(0)])
    got = await echo(net["QMA"].qm, "SVC.QUOTE", 2)
    assert [m.body for m in got] == [b"q0", b"q1"]
    assert await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=200) == []
    stats = svc.stats()
    assert stats["requests_sent"] == 2 and stats["duplicates_filtered"] == 1


async def test_a_refused_request_in_a_batch_gets_its_error_reply_and_the_others_go_once(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The middle request is too long for the destination (2030): the batch's unit of
    work is backed out and the batch sent one request at a time, so the first and last
    requests reach the queue once each, in order, and the middle one is refused with
    an error reply, as it would be alone."""
    net["GW"].qm.run_mqsc("DEFINE QLOCAL(SMALL.SVC) MAXMSGL(64)", stop_on_error=True)
    gw = gateway(requests=[_route(destination="SMALL.SVC@GW")], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb4")
    commits = _count_commits(svc)
    batch = [_request(0), _request(1, b"x" * 100), _request(2)]
    await svc.on_requests(svc.requests["quote"], batch)
    queued = await drain(net["GW"].qm, "SMALL.SVC", wait_ms=200)
    assert [m.body for m in queued] == [b"q0", b"q2"]
    (err,) = await get_bus("rb4").exchanges.wait_on("answers", 1, timeout=10)
    body = json.loads(err.payload)
    assert err.correlation_data == b"c-1"
    assert body["error"] == "refused" and body["feedback"] == Reason.MSG_TOO_BIG_FOR_Q
    stats = svc.stats()
    assert stats["requests_sent"] == 2 and stats["error_replies.refused"] == 1
    assert commits[0] == 2  # the two sent one at a time; the batch's unit committed nothing


async def test_a_batch_behind_a_request_sent_alone_is_answered_too(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """A single request takes the one-request path; batches before and after it mix
    with it on the same route."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb5")
    route = svc.requests["quote"]
    await svc.on_requests(route, [_request(0)])
    await svc.on_requests(route, [_request(1), _request(2)])
    app = asyncio.create_task(echo(net["QMA"].qm, "SVC.QUOTE", 3))
    replies = await get_bus("rb5").exchanges.wait_on("answers", 3, timeout=20)
    assert [m.body for m in await app] == [b"q0", b"q1", b"q2"]
    assert sorted(r.payload for r in replies) == [b"re:q0", b"re:q1", b"re:q2"]


async def test_a_failed_commit_sends_the_batch_one_request_at_a_time_once_in_order(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb6")
    failed = [False]

    def fail_first_commit(conn: Any) -> None:
        commit = conn.commit

        async def once_failing() -> None:
            if not failed[0]:
                failed[0] = True
                raise MQError(Reason.BACKED_OUT, "injected commit failure")
            await commit()

        conn.commit = once_failing

    _wrap_connections(svc, fail_first_commit)
    await svc.on_requests(svc.requests["quote"], [_request(n) for n in range(4)])
    got = await echo(net["QMA"].qm, "SVC.QUOTE", 4)
    assert [m.body for m in got] == [b"q0", b"q1", b"q2", b"q3"]
    assert await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=200) == []
    assert failed[0] and svc.stats()["requests_sent"] == 4


async def test_a_cancel_during_the_commit_still_marks_the_unit_sent(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The plugin stopping (its handler cancelled) while the unit commits: the commit
    and the marks end together, so the batch redelivered after the restart puts
    nothing again (a commit without its marks would put all five twice)."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb7")
    handler: list[asyncio.Task[None]] = []

    def cancel_during_first_commit(conn: Any) -> None:
        commit = conn.commit

        async def cancelling() -> None:
            if handler:
                handler.pop().cancel()  # the cancel lands while the commit runs
            await commit()

        conn.commit = cancelling

    _wrap_connections(svc, cancel_during_first_commit)
    batch = [_request(n) for n in range(5)]
    handler.append(asyncio.create_task(svc.on_requests(svc.requests["quote"], batch)))
    first = handler[0]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not handler  # it was cancelled during the commit
    await svc.on_requests(svc.requests["quote"], batch)  # the redelivery
    got = await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=500)
    assert [m.body for m in got] == [b"q%d" % n for n in range(5)]
    assert svc.stats()["duplicates_filtered"] == 5


async def test_the_batch_stops_putting_at_the_first_refused_put(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """A failed put ends the unit's puts (on IBM MQ, a put after a broken connection
    reconnects with backoff for each request left): two put attempts in the batch
    path, then one per request one at a time."""
    net["GW"].qm.run_mqsc("DEFINE QLOCAL(SMALL.SVC2) MAXMSGL(64)", stop_on_error=True)
    gw = gateway(requests=[_route(destination="SMALL.SVC2@GW")], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb8")
    attempts: list[bytes] = []

    class CountingHandle:
        def __init__(self, handle: Any) -> None:
            self._handle = handle

        async def put(self, md: Any, body: bytes, *args: Any) -> Any:
            attempts.append(body)
            return await self._handle.put(md, body, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._handle, name)

    def count_puts(conn: Any) -> None:
        open_queue = conn.open

        async def counting_open(*args: Any, **kwargs: Any) -> Any:
            return CountingHandle(await open_queue(*args, **kwargs))

        conn.open = counting_open

    _wrap_connections(svc, count_puts)
    batch = [_request(0), _request(1, b"x" * 100)] + [_request(n) for n in range(2, 5)]
    await svc.on_requests(svc.requests["quote"], batch)
    assert attempts == [b"q0", b"x" * 100, b"q0", b"x" * 100, b"q2", b"q3", b"q4"]
    queued = await drain(net["GW"].qm, "SMALL.SVC2", wait_ms=200)
    assert [m.body for m in queued] == [b"q0", b"q2", b"q3", b"q4"]


async def test_a_request_that_cannot_be_planned_fails_at_its_place_after_the_ones_before(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The batch path leaves such a batch to the one-request path, which sends the
    requests before it and raises its error there, as before batches existed."""

    class Unreadable(dict[str, str]):
        def items(self) -> Any:
            raise ValueError("properties cannot be read")

    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc = await _started(gw, "rb9")
    broken = Envelope("", "quote/req", b"q1", reply_topic="answers", correlation_data=b"c-1",
                      properties=Unreadable())
    with pytest.raises(ValueError, match="properties cannot be read"):
        await svc.on_requests(svc.requests["quote"], [_request(0), broken, _request(2)])
    got = await drain(net["QMA"].qm, "SVC.QUOTE", wait_ms=1000)
    assert [m.body for m in got] == [b"q0"]
    assert svc.stats()["requests_sent"] == 1
