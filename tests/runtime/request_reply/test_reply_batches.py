"""Replies waiting together on the reply queue go to the requesters in one unit of work
(reply_batches.py): one produce per plugin instance, one MQ commit, and whatever needs
a reply's own outcome (junk, a duplicate, a refusal, an outage) still gets it, with
nothing lost or produced twice."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from gateway.mq.embedded.network import Network
from gateway.mq.port import GetOptions, Message, OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.request_reply.service import RequestReplyService
from gateway.wire.constants import MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from plugins.memory import get_bus
from tests.network.network_helpers import drain, wait_for
from tests.runtime.request_reply.conftest import Gateway
from tests.support.exchanges import started_memory

REPLY_QUEUE = "MQGW.REPLY"
NO_PENDING_REQUEST = 65537


def _route() -> dict[str, object]:
    return {"name": "quote", "plugin": "req", "source": "quote/req",
            "destination": "SVC.QUOTE", "timeout": 30.0}


def _request(n: int) -> Envelope:
    return Envelope("", "quote/req", b"q%d" % n, reply_topic="answers",
                    correlation_data=b"c-%d" % n)


async def _started(gw: Gateway, bus: str, **memory: Any) -> tuple[RequestReplyService,
                                                                  list[int]]:
    """The service with a memory instance ``req`` on ``bus``, and the sizes of the
    produce calls the service makes to it."""
    svc = await gw.start()
    gw.instances["req"] = inst = await started_memory("req", bus, **memory)
    sizes: list[int] = []
    produce = inst.produce

    async def counted(envelopes: Sequence[Envelope]) -> None:
        sizes.append(len(envelopes))
        await produce(envelopes)

    inst.produce = counted  # type: ignore[method-assign]
    svc.attach("req", inst)
    return svc, sizes


async def _requests_at_the_service(net: Network, count: int) -> list[Message]:
    """The ``count`` requests the gateway put, taken off SVC.QUOTE unanswered."""
    got: list[Message] = []
    async with await net["QMA"].qm.connect() as conn:
        q = await conn.open("SVC.QUOTE", OpenOption.INPUT_SHARED)
        for _ in range(count):
            got.append(await q.get(GetOptions(wait_ms=15_000)))
    return got


async def _replies_together(net: Network, bodies: Sequence[tuple[bytes, bytes]]) -> None:
    """(CorrelId, body) of each reply, put on the gateway's reply queue in one unit of
    work: they are there together when the gateway's reader sees the first."""
    async with await net["GW"].qm.connect() as conn:
        for correl_id, body in bodies:
            md = MQMD(msg_type=MsgType.REPLY, format="MQSTR", correl_id=correl_id)
            await conn.put1(REPLY_QUEUE, md, body, PutOptions(syncpoint=True, new_msg_id=True))
        await conn.commit()


async def _sent(svc: RequestReplyService, net: Network, count: int) -> list[Message]:
    await svc.on_requests(svc.requests["quote"], [_request(n) for n in range(count)])
    return await _requests_at_the_service(net, count)


async def test_replies_waiting_together_are_produced_together(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc, sizes = await _started(gw, "rp1")
    requests = await _sent(svc, net, 6)
    await _replies_together(net, [(m.md.msg_id, b"re:" + m.body) for m in requests])
    replies = await get_bus("rp1").exchanges.wait_on("answers", 6, timeout=20)
    assert {(r.correlation_data, r.payload) for r in replies} == {
        (b"c-%d" % n, b"re:q%d" % n) for n in range(6)
    }
    await wait_for(lambda: svc.stats().get("replies_delivered") == 6, timeout=20)
    assert sizes == [6]  # one produce for the six replies, not one each
    assert svc.stats()["requester_open"] == 0
    assert await drain(net["GW"].qm, REPLY_QUEUE, wait_ms=100) == []


async def test_junk_a_duplicate_and_a_notice_among_replies_each_get_their_outcome(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """In one unit: a reply, junk nobody waits for, a reply, the same reply again, a
    COA notice, a reply. Every requester gets its reply once (and the COA notice), the
    junk goes to the DLQ with reason 65537, the queue ends empty."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc, _ = await _started(gw, "rp2")
    requests = await _sent(svc, net, 3)
    ids = [m.md.msg_id for m in requests]
    async with await net["GW"].qm.connect() as conn:
        def put(correl_id: bytes, body: bytes, **md: Any) -> Any:
            return conn.put1(REPLY_QUEUE, MQMD(format="MQSTR", correl_id=correl_id,
                                                **{"msg_type": MsgType.REPLY, **md}),
                             body, PutOptions(syncpoint=True, new_msg_id=True))

        await put(ids[0], b"r0")
        await put(b"junk".ljust(24, b"\0"), b"junk")
        await put(ids[1], b"r1")
        await put(ids[1], b"r1 again")
        await put(ids[2], b"", msg_type=MsgType.REPORT, feedback=259)  # COA
        await put(ids[2], b"r2")
        await conn.commit()
    bus = get_bus("rp2").exchanges
    await bus.wait_on("answers", 4, timeout=20)
    await wait_for(lambda: svc.stats().get("duplicates_filtered", 0) == 1
                   and svc.stats().get("replies_unmatched", 0) == 1
                   and svc.stats().get("replies_delivered", 0) == 3, timeout=20)
    replies = bus.on("answers")
    assert sorted(r.payload for r in replies if r.properties.get("mq.error") is None) == [
        b"r0", b"r1", b"r2"
    ]
    (coa,) = [r for r in replies if r.properties.get("mq.error") is not None]
    assert coa.correlation_data == b"c-2" and json.loads(coa.payload)["error"] == "coa"
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE", wait_ms=100)
    dlh, _, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == NO_PENDING_REQUEST and body == b"junk"
    assert await drain(net["GW"].qm, REPLY_QUEUE, wait_ms=100) == []
    assert svc.stats()["requester_open"] == 0


async def test_a_reply_the_plugin_refuses_among_others(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The middle reply is too large for the plugin: its requester gets the error reply
    "refused", the reply goes to the DLQ with the plugin's reason, the other two
    requesters get their replies once."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc, _ = await _started(gw, "rp3", refuse_larger_than=100)
    requests = await _sent(svc, net, 3)
    await _replies_together(net, [
        (requests[0].md.msg_id, b"r0"),
        (requests[1].md.msg_id, b"x" * 200),
        (requests[2].md.msg_id, b"r2"),
    ])
    bus = get_bus("rp3").exchanges
    await bus.wait_on("answers", 3, timeout=20)
    await wait_for(lambda: svc.stats()["requester_open"] == 0
                   and svc.stats().get("replies_delivered") == 2, timeout=20)
    by_corr = {r.correlation_data: r for r in bus.on("answers")}
    assert len(bus.on("answers")) == 3
    assert by_corr[b"c-0"].payload == b"r0" and by_corr[b"c-2"].payload == b"r2"
    error = json.loads(by_corr[b"c-1"].payload)
    assert error["error"] == "refused" and error["feedback"] == Reason.MSG_TOO_BIG_FOR_Q
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE", wait_ms=100)
    dlh, _, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == Reason.MSG_TOO_BIG_FOR_Q and body == b"x" * 200
    assert await drain(net["GW"].qm, REPLY_QUEUE, wait_ms=100) == []


async def test_replies_together_while_the_plugin_is_down_are_delivered_once_after(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """The requester's plugin is down when five replies arrive together: the unit is
    backed out and tried again; once the plugin is back each requester gets its reply
    exactly once and nothing is dead-lettered."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc, _ = await _started(gw, "rp4")
    requests = await _sent(svc, net, 5)
    bus = get_bus("rp4")
    bus.down = True
    await _replies_together(net, [(m.md.msg_id, b"re:" + m.body) for m in requests])
    await wait_for(lambda: "quote" in svc.reply_failing_since, timeout=20)
    bus.down = False
    await bus.exchanges.wait_on("answers", 5, timeout=30)
    await wait_for(lambda: svc.stats().get("replies_delivered") == 5, timeout=20)
    assert svc.stats()["requester_open"] == 0
    assert await drain(net["GW"].qm, REPLY_QUEUE, wait_ms=100) == []
    assert sorted(r.payload for r in bus.exchanges.on("answers")) == [
        b"re:q%d" % n for n in range(5)
    ]
    assert await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE", wait_ms=100) == []


async def test_a_reply_topic_refused_by_reply_time_is_refused_once_among_others(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    """One of two replies waiting together is for a reply topic that became one of the
    gateway's own after its request came in: that reply goes to the DLQ with 2035 and
    its entry ends ``refused`` (counted once), the other is delivered."""
    gw = gateway(requests=[_route()], reply_to_q="MQGW.REPLY.ALIAS")
    svc, _ = await _started(gw, "rp5")
    await svc.on_requests(svc.requests["quote"], [
        _request(0), Envelope("", "quote/req", b"q1", reply_topic="kept",
                              correlation_data=b"c-1"),
    ])
    requests = await _requests_at_the_service(net, 2)
    svc.own_topic = lambda instance, topic: "the gateway's own" if topic == "kept" else ""
    await _replies_together(net, [(m.md.msg_id, b"re:" + m.body) for m in requests])
    await wait_for(lambda: svc.stats().get("replies_dead_lettered") == 1
                   and svc.stats().get("replies_delivered") == 1, timeout=20)
    (answer,) = get_bus("rp5").exchanges.on("answers")
    assert answer.payload == b"re:q0"
    assert get_bus("rp5").exchanges.on("kept") == []
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE", wait_ms=100)
    dlh, _, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == Reason.NOT_AUTHORIZED and body == b"re:q1"
    assert svc.stats()["destinations_refused"] == 1
    assert svc.stats()["requester_open"] == 0
