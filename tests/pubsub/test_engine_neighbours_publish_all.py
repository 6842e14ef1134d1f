"""``publish_all`` neighbours: a real legacy broker never registers its subscriptions at
the gateway (it propagates them with its own protocol), so publications on a shared
stream are forwarded to it whether or not it subscribed here — once, never back to the
broker they came from, never on a stream it does not share."""

from __future__ import annotations

import dataclasses

from gateway.pubsub.commands import CommandName
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.inbound import decode_command_message
from gateway.pubsub.neighbours import NeighbourKind
from gateway.pubsub.options import PubOpt
from gateway.pubsub.outcome import Outcome
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import CONTROL_QUEUE, DEFAULT_STREAM
from gateway.wire.constants import CompCode, MsgType
from tests.pubsub.test_engine_neighbours import BULLETIN, nb, publish_message
from tests.support.pubsub_messages import rfh_message

SPORTS = "SPORTS.STREAM"


def gateway(publish_all: bool = True) -> PubSubEngine:
    legacy = dataclasses.replace(
        nb("QMA", NeighbourKind.MQPUBSUB, frozenset({DEFAULT_STREAM, BULLETIN})),
        publish_all=publish_all,
    )
    return PubSubEngine("GW", MemoryStore(), neighbours={"QMA": legacy})


def to_neighbour(out: Outcome) -> list[tuple[str, str, bytes]]:
    return [
        (d.destination.q_mgr, d.destination.queue, d.body)
        for d in out.deliveries
        if d.destination.q_mgr == "QMA"
    ]


def test_a_publication_on_a_shared_stream_is_forwarded_without_a_subscription() -> None:
    gw = gateway()
    out = gw.handle(publish_message("GW", "news/today", b"hello"))
    sent = to_neighbour(out)
    assert [(q, queue) for q, queue, _ in sent] == [("QMA", BULLETIN)]
    d = next(d for d in out.deliveries if d.destination.q_mgr == "QMA")
    parsed = decode_command_message(d.md, d.body)
    assert parsed.command.name is CommandName.PUBLISH
    assert parsed.command.topics == ["news/today"]
    assert parsed.command.q_mgr_name == "GW"  # our identity: never echoed back to us
    assert parsed.command.pub_opts & PubOpt.OTHER_SUBSCRIBERS_ONLY
    assert parsed.command.pub_opts & PubOpt.NO_REGISTRATION
    assert parsed.payload == b"hello"


def test_not_without_publish_all_nor_on_an_unshared_stream_nor_back_to_its_source() -> None:
    assert to_neighbour(gateway(publish_all=False).handle(publish_message("GW", "n", b"x"))) == []
    gw = gateway()
    assert to_neighbour(gw.handle(publish_message("GW", "n", b"x", stream=SPORTS))) == []
    assert to_neighbour(gw.handle(publish_message("QMA", "n", b"x"))) == []


def test_a_neighbour_that_also_subscribed_gets_one_copy() -> None:
    gw = gateway()
    reg = gw.handle(
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", "news/*"),
                ("MQPSQMgrName", "QMA"),
                ("MQPSQName", BULLETIN),
            ],
            reply_to_q_mgr="QMA",
            msg_type=MsgType.REQUEST,
            reply_to_q="R.Q",
        )
    )
    assert reg.comp_code == CompCode.OK
    gw.commit()
    assert len(to_neighbour(gw.handle(publish_message("GW", "news/today", b"x")))) == 1
