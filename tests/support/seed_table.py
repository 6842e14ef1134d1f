"""The seed's stream table (seeds/streams.en.txt) as data: how each subscriber note
(S1-S4) registers and how each publisher note (P1-P4) publishes, in both variants the
note allows. Shared by the pure-engine test and the embedded-queue-manager test."""

from __future__ import annotations

from gateway.pubsub.outcome import InboundMessage
from gateway.wire.constants import MsgType
from tests.support.pubsub_messages import CONTROL, DEFAULT, rfh2_message, rfh_message

STREAMX = "StreamX"
TOPIC = "IBM/Latest"
PREFIXED = f"$SYS/STREAM/{STREAMX}/{TOPIC}"
#: A queue serviced with Implicit Stream Naming off (P1's second variant).
NO_IMPLICIT_QUEUE = "PLAIN.IN"

CELLS = [
    (sub, pub, stream, variant)
    for sub in ("RFH", "RFH2")
    for pub in ("RFH", "RFH2")
    for stream in (DEFAULT, STREAMX)
    for variant in ("explicit", "implicit")
]


def note(sub: str, pub: str, stream: str) -> str:
    s = {
        ("RFH", DEFAULT): "S1",
        ("RFH", STREAMX): "S2",
        ("RFH2", DEFAULT): "S3",
        ("RFH2", STREAMX): "S4",
    }[(sub, stream)]
    p = {
        ("RFH", DEFAULT): "P1",
        ("RFH", STREAMX): "P2",
        ("RFH2", DEFAULT): "P3",
        ("RFH2", STREAMX): "P4",
    }[(pub, stream)]
    return f"{s},{p}"


IDS = [
    f"{s}sub-{p}pub-{'default' if st == DEFAULT else 'StreamX'}-{v}-{note(s, p, st)}"
    for s, p, st, v in CELLS
]


def subscription(sub_fmt: str, stream: str, queue: str) -> InboundMessage:
    """Register as notes S1 (RFH, default), S2 (RFH, StreamX), S3 (RFH2), S4 (RFH2 prefix)."""
    if sub_fmt == "RFH":
        pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", TOPIC), ("MQPSQName", queue)]
        if stream == STREAMX:
            pairs.append(("MQPSStreamName", STREAMX))
        return rfh_message(CONTROL, pairs, reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST)
    topic = PREFIXED if stream == STREAMX else TOPIC
    return rfh2_message(
        CONTROL,
        [("Command", "RegSub"), ("Topic", topic), ("QName", queue)],
        reply_to_q="REPLY.Q",
        msg_type=MsgType.REQUEST,
    )


def publication(pub_fmt: str, stream: str, variant: str) -> InboundMessage:
    """Publish as notes P1/P2 (MQRFH) or P3/P4 (MQRFH2), in one of two variants."""
    if pub_fmt == "RFH":
        pairs = [("MQPSCommand", "Publish"), ("MQPSTopic", TOPIC)]
        if stream == DEFAULT:
            if variant == "explicit":  # P1: stream name given, on any queue
                pairs.append(("MQPSStreamName", DEFAULT))
                return rfh_message(STREAMX, pairs, b"payload")
            # P1: no stream name, on a queue whose Implicit Stream Naming is false
            return rfh_message(NO_IMPLICIT_QUEUE, pairs, b"payload", implicit_stream_naming=False)
        if variant == "explicit":  # P2: stream name StreamX on any queue
            pairs.append(("MQPSStreamName", STREAMX))
            return rfh_message(DEFAULT, pairs, b"payload")
        # P2: no stream name on queue StreamX with Implicit Stream Naming true
        return rfh_message(STREAMX, pairs, b"payload", implicit_stream_naming=True)
    topic = TOPIC if stream == DEFAULT else PREFIXED  # P3 / P4
    # "any queue": Implicit Stream Naming never applies to MQRFH2 publications
    queue = DEFAULT if variant == "explicit" else STREAMX
    return rfh2_message(queue, [("Command", "Publish"), ("Topic", topic)], b"payload")
