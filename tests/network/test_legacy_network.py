"""Smoke test of the seed's figure as three processes (tests/support/legacy_network.py):
BROKERA and BROKERB (``mqgw broker --profile legacy``) and GW (``mqgw run``) start, their
channels run, and an MQRFH publication put at BROKERA for BROKERB's stream queue crosses
GW's queue manager (A has no channel to B) and reaches a subscriber registered at
BROKERB, also after GW was SIGKILLed and restarted while the publication waited."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pubsub.outcome import InboundMessage
from gateway.wire.constants import MsgType
from tests.support.legacy_network import (
    BROKERA,
    BROKERB,
    GW,
    TESTER,
    LegacyNetwork,
    network_mqsc,
    start_legacy_network,
)
from tests.support.pubsub_messages import CONTROL, Received, decode, rfh_message

#: At A: a remote queue for B's BULLETIN.STREAM through xmitq GW (A has no channel to
#: B), so the message must cross GW's queue manager, which resolves BROKERB again.
A_TO_B = (
    "DEFINE QREMOTE(B.BULLETIN) RNAME(BULLETIN.STREAM) RQMNAME(BROKERB) XMITQ(GW) REPLACE\n"
)


async def _register_at_b(net: LegacyNetwork, sub_q: str, replies: str) -> None:
    """RegSub at BROKERB for News/* on BULLETIN.STREAM, subscriber queue on TESTER."""
    reg = rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", "BULLETIN.STREAM"),
         ("MQPSTopic", "News/*"), ("MQPSQMgrName", TESTER), ("MQPSQName", sub_q)],
        reply_to_q=replies, reply_to_q_mgr=TESTER, msg_type=MsgType.REQUEST,
    )
    await net.put(BROKERB, CONTROL, reg.md, reg.body)
    response = await _received(net, replies)
    assert response.get("MQPSCompCode") == "0", response.pairs


async def _received(net: LegacyNetwork, queue: str) -> Received:
    msg = await net.get(queue)
    return decode(msg.md, msg.body)


def _publication(topic: str, payload: bytes) -> InboundMessage:
    return rfh_message(
        "B.BULLETIN",
        [("MQPSCommand", "Publish"), ("MQPSStreamName", "BULLETIN.STREAM"),
         ("MQPSTopic", topic)],
        payload, reply_to_q_mgr=BROKERA,
    )


def test_generated_mqsc_pairs_every_channel() -> None:
    mqsc = network_mqsc({BROKERA: 1, BROKERB: 2, GW: 3, TESTER: 4})
    assert "DEFINE CHANNEL(BROKERA.TO.GW) CHLTYPE(SDR) CONNAME('127.0.0.1(3)') XMITQ(GW)" \
        in mqsc[BROKERA]
    assert "DEFINE CHANNEL(BROKERA.TO.GW) CHLTYPE(RCVR)" in mqsc[GW]
    assert "DEFINE CHANNEL(GW.TO.BROKERB) CHLTYPE(SDR) CONNAME('127.0.0.1(2)') XMITQ(BROKERB)" \
        in mqsc[GW]
    assert "QREMOTE(BROKERB) RNAME(' ') RQMNAME(BROKERB) XMITQ(GW)" in mqsc[BROKERA]
    assert "XMITQ(BROKERB)" not in mqsc[BROKERA]  # A reaches B only through GW
    for name in (BROKERA, BROKERB, GW):
        assert f"CHANNEL({TESTER}.TO.{name}) CHLTYPE(SDR)" in mqsc[TESTER]
        assert f"CHANNEL({name}.TO.{TESTER}) CHLTYPE(SDR)" in mqsc[name]


@pytest.mark.slow
async def test_three_processes_carry_a_publication_from_a_through_gw_to_b(
    tmp_path: Path,
) -> None:
    net = await start_legacy_network(tmp_path, extra_mqsc={BROKERA: A_TO_B})
    try:
        for name in (BROKERA, BROKERB, GW):
            assert net.process(name).running, net.log_tails()
        sub_q = net.subscriber_queue("B.SUBS")
        replies = net.subscriber_queue("REPLIES")
        await _register_at_b(net, sub_q, replies)

        pub = _publication("News/first", b"one")
        await net.put(BROKERA, "B.BULLETIN", pub.md, pub.body)
        got = await _received(net, sub_q)
        assert (got.topic, got.get("MQPSStreamName"), got.payload) == (
            "News/first", "BULLETIN.STREAM", b"one"), net.log_tails()

        # GW down: the publication waits on A's xmitq GW; GW's restart delivers it once.
        net.kill(GW)
        pub = _publication("News/second", b"two")
        await net.put(BROKERA, "B.BULLETIN", pub.md, pub.body)
        await net.restart(GW)
        got = await _received(net, sub_q)
        assert (got.topic, got.payload) == ("News/second", b"two"), net.log_tails()
        assert await net.drain(sub_q) == []
        assert net.stop(GW) == 0, net.log_tail(GW)
        assert net.stop(BROKERB) == 0, net.log_tail(BROKERB)
    finally:
        await net.close()


@pytest.mark.slow
async def test_legacy_broker_refuses_an_unsupported_stream(tmp_path: Path) -> None:
    """BROKERA supports STOCK and BULLETIN only: a RegSub on SPORTS.STREAM is refused with
    MQRCCF_STREAM_ERROR (3071), as the V6 broker did."""
    net = await start_legacy_network(tmp_path)
    try:
        replies = net.subscriber_queue("REPLIES")
        reg = rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSStreamName", "SPORTS.STREAM"),
             ("MQPSTopic", "Scores/*"), ("MQPSQMgrName", TESTER), ("MQPSQName", replies)],
            reply_to_q=replies, reply_to_q_mgr=TESTER, msg_type=MsgType.REQUEST,
        )
        await net.put(BROKERA, CONTROL, reg.md, reg.body)
        response = await _received(net, replies)
        assert (response.get("MQPSCompCode"), response.get("MQPSReason")) == ("2", "3071")
    finally:
        await net.close()
