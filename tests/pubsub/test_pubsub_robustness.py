"""Whatever a message contains, the engine answers with an outcome and never raises:
garbage is dead-lettered with a reason, so a bad message can never block its queue."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from tests.support.pubsub_messages import CONTROL, DEFAULT, rfh2_message, rfh_message

SEEDS = [
    rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSTopic", "a/*"), ("MQPSQName", "Q")],
        reply_to_q="R",
        msg_type=1,
    ),
    rfh_message(
        DEFAULT,
        [("MQPSCommand", "Publish"), ("MQPSTopic", "a/b"), ("MQPSPubOpts", "RetainPub")],
        b"payload",
    ),
    rfh2_message(
        CONTROL,
        [("Command", "RegSub"), ("Topic", "a/#"), ("QName", "Q2")],
        reply_to_q="R",
        msg_type=1,
    ),
    rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "a/b")], b"payload"),
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(SEEDS),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=6),
    cut=st.integers(0, 400),
    fmt=st.sampled_from([None, FMT_RF_HEADER, FMT_RF_HEADER_2, "MQSTR", ""]),
)
def test_mutated_messages_never_raise(
    seed: object, flips: list[tuple[int, int]], cut: int, fmt: str | None
) -> None:
    engine = PubSubEngine("QM1", MemoryStore())
    for s in SEEDS:  # some state for publications to match
        engine.handle(s)
    msg = seed.__class__(seed.queue, seed.md.copy(), seed.body)  # type: ignore[attr-defined]
    body = bytearray(msg.body)
    for pos, value in flips:
        if pos < len(body):
            body[pos] = value
    msg.body = bytes(body[: max(cut, 0)] if cut < len(body) else body)
    if fmt is not None:
        msg.md.format = fmt
    outcome = engine.handle(msg)
    if outcome.comp_code == 2:
        assert outcome.reason != 0
    if outcome.dead_letter is not None:
        assert outcome.dead_letter.reason == outcome.reason
    engine.commit()
