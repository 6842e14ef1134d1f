"""Gateway as service provider: an MQ application's request on a queue GW hosts → the
plugin-side responder → the MQ reply to ReplyToQ@ReplyToQMgr with MQ's CorrelId rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.port import OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.wire.constants import Feedback, MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from plugins.memory import get_bus
from tests.network.network_helpers import drain, get_one, wait_for
from tests.runtime.request_reply.conftest import Gateway

SERVICE = {"name": "pricing", "queue": "GW.PRICING", "plugin": "resp",
           "target": "pricing/req", "replies": "pricing/rep", "timeout": 15.0}


async def put_request(net: Network, *, report: int = 0, correl_id: bytes = b"\0" * 24,
                      reply_q_mgr: str = "QMA", expiry: int = -1, on: str = "QMA",
                      reply_to_q: str = "APP.REPLY") -> MQMD:
    """The MQ application's request to GW.PRICING (a cluster queue GW hosts)."""
    async with await net[on].qm.connect() as conn:
        q = await conn.open("GW.PRICING", OpenOption.OUTPUT)
        md = MQMD(msg_type=MsgType.REQUEST, format="MQSTR", reply_to_q=reply_to_q,
                  reply_to_q_mgr=reply_q_mgr, report=report, correl_id=correl_id,
                  expiry=expiry)
        out = await q.put(md, b"price?", PutOptions(new_msg_id=True))
        await q.close()
        return out


async def respond(bus_name: str, count: int = 1, payload: bytes = b"42") -> list[Envelope]:
    """The plugin-side responder: answers every request on pricing/req."""
    bus = get_bus(bus_name)
    reqs = await bus.exchanges.wait_on("pricing/req", count, timeout=20)
    await bus.exchanges.append(
        [Envelope("", r.reply_topic, payload, correlation_data=r.correlation_data) for r in reqs]
    )
    return reqs


@pytest.mark.parametrize("report", [0, int(Report.PASS_CORREL_ID)],
                         ids=["copy_msg_id", "pass_correl_id"])
async def test_provider_round_trip_follows_the_report_options(
    net: Network, gateway: Callable[..., Gateway], report: int
) -> None:
    gw = gateway(services=[SERVICE])
    svc = await gw.start(resp="s1")
    sent = await put_request(net, report=report, correl_id=b"C" * 24)
    (req,) = await respond("s1")
    assert req.payload == b"price?" and req.reply_topic == "pricing/rep"
    assert req.correlation_data == sent.msg_id
    assert req.properties["mq.reply.to.q"] == "APP.REPLY"
    reply = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=20_000)
    assert reply.md.msg_type == MsgType.REPLY and reply.body == b"42"
    expected = b"C" * 24 if report & Report.PASS_CORREL_ID else sent.msg_id
    assert reply.md.correl_id == expected
    assert reply.md.msg_id != sent.msg_id  # no PASS_MSG_ID: a new MsgId
    await wait_for(lambda: svc.stats().get("service_replies") == 1)
    # a second reply with the same correlation data is filtered (one MQ reply only)
    await get_bus("s1").exchanges.append(
        [Envelope("", "pricing/rep", b"again", correlation_data=sent.msg_id)]
    )
    await wait_for(lambda: svc.stats().get("duplicates_filtered") == 1)
    assert await drain(net["QMA"].qm, "APP.REPLY", wait_ms=200) == []


async def test_unresolvable_reply_to_q_mgr_is_dead_lettered_with_the_reason(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[SERVICE])
    svc = await gw.start(resp="s2")
    await put_request(net, reply_q_mgr="NOWHERE", on="GW")
    await respond("s2")
    await wait_for(lambda: svc.stats().get("replies_dead_lettered") == 1, timeout=15)
    (dead,) = await drain(net["GW"].qm, "SYSTEM.DEAD.LETTER.QUEUE")
    dlh, md, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == 2087  # MQRC_UNKNOWN_REMOTE_Q_MGR
    assert dlh.dest_q_name.strip() == "APP.REPLY"
    assert dlh.dest_q_mgr_name.strip() == "NOWHERE"
    assert md.msg_type == MsgType.REPLY and body == b"42"


async def test_no_responder_answer_gives_an_expiration_report_when_asked(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[{**SERVICE, "timeout": 0.3}])
    await gw.start(resp="s3")
    sent = await put_request(net, report=int(Report.EXPIRATION))
    report = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=20_000)
    assert report.md.msg_type == MsgType.REPORT
    assert report.md.feedback == Feedback.EXPIRATION
    assert report.md.correl_id == sent.msg_id


async def test_no_report_when_the_request_asks_none(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[{**SERVICE, "timeout": 0.2}])
    svc = await gw.start(resp="s4")
    await put_request(net)
    await wait_for(lambda: svc.stats().get("timeouts") == 1, timeout=15)
    assert await drain(net["QMA"].qm, "APP.REPLY", wait_ms=300) == []


async def test_restart_between_request_and_reply(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[SERVICE])
    await gw.start(resp="s5")
    sent = await put_request(net)
    await get_bus("s5").exchanges.wait_on("pricing/req", 1, timeout=20)
    await wait_for(lambda: gw.svc is not None and gw.svc.stats().get("service_requests") == 1)
    await gw.stop()
    await respond("s5")  # the responder answers while the gateway is down
    await gw.start(resp="s5")
    reply = await get_one(net["QMA"].qm, "APP.REPLY", wait_ms=20_000)
    assert reply.md.correl_id == sent.msg_id and reply.body == b"42"
    await asyncio.sleep(0.2)
    assert len(get_bus("s5").exchanges.on("pricing/req")) == 1  # not produced again


async def test_datagram_on_a_service_queue_is_forwarded_without_an_entry(
    net: Network, gateway: Callable[..., Gateway]
) -> None:
    gw = gateway(services=[SERVICE])
    svc = await gw.start(resp="s6")
    async with await net["GW"].qm.connect() as conn:
        await conn.put1("GW.PRICING", MQMD(format="MQSTR"), b"fyi", PutOptions())
    (env,) = await get_bus("s6").exchanges.wait_on("pricing/req", 1, timeout=10)
    assert env.payload == b"fyi" and env.reply_topic == "" and env.correlation_data == b""
    await wait_for(lambda: svc.stats().get("service_requests") == 1)
    assert svc.stats()["service_open"] == 0
