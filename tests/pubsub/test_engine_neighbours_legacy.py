"""The legacy profile (``supported_streams``): a broker that supports only its configured
streams refuses commands on any other with MQRCCF_STREAM_ERROR (3071), as the V6 broker
did; the default and admin streams are always supported."""

from __future__ import annotations

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage, Outcome
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import ADMIN_STREAM, CONTROL_QUEUE, DEFAULT_STREAM
from gateway.wire.constants import CompCode, MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import decode, rfh2_message, rfh_message

STOCK = "STOCK.STREAM"
BULLETIN = "BULLETIN.STREAM"
SPORTS = "SPORTS.STREAM"


def broker_a() -> PubSubEngine:
    """BROKERA of the seed's figure: default, STOCK.STREAM, BULLETIN.STREAM."""
    return PubSubEngine("BROKERA", MemoryStore(), supported_streams=frozenset({STOCK, BULLETIN}))


def rfh(queue: str, command: str, stream: str, *extra: tuple[str, str]) -> InboundMessage:
    pairs = [("MQPSCommand", command), ("MQPSStreamName", stream), ("MQPSTopic", "t"), *extra]
    return rfh_message(
        queue,
        pairs,
        b"data" if command == "Publish" else b"",
        reply_to_q="APP.Q",
        reply_to_q_mgr="BROKERA",
        msg_type=MsgType.REQUEST,
    )


def assert_stream_error(out: Outcome, stream: str) -> None:
    assert (out.comp_code, out.reason) == (CompCode.FAILED, Reason.STREAM_ERROR)
    assert out.reason == 3071
    assert out.deliveries == [] and out.mutations == [] and out.forwards == []
    assert out.dead_letter is None
    assert out.response is not None
    got = decode(out.response.md, out.response.body)
    assert got.get("MQPSCompCode") == "2"
    assert got.get("MQPSReason") == "3071"
    assert got.get("MQPSParmId") == "MQPSStreamName"
    assert got.get("MQPSStreamName") == stream


@pytest.mark.parametrize(
    ("queue", "command"),
    [
        (CONTROL_QUEUE, "RegSub"),
        (CONTROL_QUEUE, "DeregSub"),
        (CONTROL_QUEUE, "ReqUpdate"),
        (BULLETIN, "Publish"),  # a supported stream queue naming another stream
        (BULLETIN, "DeletePub"),
    ],
)
def test_commands_on_an_unsupported_stream_are_refused_with_stream_error(
    queue: str, command: str
) -> None:
    engine = broker_a()
    out = engine.handle(rfh(queue, command, SPORTS))
    assert_stream_error(out, SPORTS)
    assert engine.subscriptions == [] and engine.retained(SPORTS) == []


def test_a_publication_arriving_on_an_unsupported_stream_queue_is_refused() -> None:
    engine = broker_a()
    out = engine.handle(
        rfh_message(
            SPORTS,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "score")],
            b"1-0",
            reply_to_q="APP.Q",
            reply_to_q_mgr="BROKERA",
            msg_type=MsgType.REQUEST,
        )
    )
    assert (out.comp_code, out.reason) == (CompCode.FAILED, Reason.STREAM_ERROR)
    assert out.response is not None
    assert decode(out.response.md, out.response.body).get("MQPSReason") == "3071"


def test_mqrfh2_commands_name_the_stream_in_the_topic_and_are_refused_too() -> None:
    engine = broker_a()
    out = engine.handle(
        rfh2_message(
            CONTROL_QUEUE,
            [("Command", "RegSub"), ("Topic", "$SYS/STREAM/SPORTS.STREAM/score")],
            reply_to_q="APP.Q",
            reply_to_q_mgr="BROKERA",
            msg_type=MsgType.REQUEST,
        )
    )
    assert (out.comp_code, out.reason) == (CompCode.FAILED, Reason.STREAM_ERROR)
    assert out.response is not None
    got = decode(out.response.md, out.response.body)
    assert got.get("pscr/Completion") == "error"
    assert got.get("pscr/Response/Reason") == "3071"
    assert engine.subscriptions == []


@pytest.mark.parametrize("stream", [STOCK, BULLETIN, DEFAULT_STREAM, ADMIN_STREAM])
def test_supported_default_and_admin_streams_work(stream: str) -> None:
    engine = broker_a()
    out = engine.handle(rfh(CONTROL_QUEUE, "RegSub", stream))
    assert (out.comp_code, out.reason) == (CompCode.OK, 0)
    out = engine.handle(rfh(stream, "Publish", stream))
    assert (out.comp_code, out.reason) == (CompCode.OK, 0)
    assert [d.destination.queue for d in out.deliveries] == ["APP.Q"]


def test_without_a_profile_every_stream_is_served() -> None:
    engine = PubSubEngine("GW", MemoryStore())
    out = engine.handle(rfh(CONTROL_QUEUE, "RegSub", SPORTS))
    assert (out.comp_code, out.reason) == (CompCode.OK, 0)
