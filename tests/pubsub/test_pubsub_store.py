"""Durable store, batch commit/rollback, and harmless re-processing after a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import SubFormat
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import MemoryStore, PubSubStore
from gateway.pubsub.topics import Scheme
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from tests.support.pubsub_messages import CONTROL, DEFAULT, decode, rfh2_message, rfh_message


def regsub_msg(topic: str, queue: str = "SUB.Q", *opts: str) -> InboundMessage:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", topic), ("MQPSQName", queue)]
    pairs += [("MQPSRegOpts", o) for o in opts]
    return rfh_message(CONTROL, pairs, reply_to_q="R.Q", msg_type=MsgType.REQUEST)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PubSubStore:
    if request.param == "memory":
        return MemoryStore()
    return SqliteStore(tmp_path / "pubsub.db")


def test_state_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    engine = PubSubEngine("QM1", SqliteStore(path))
    engine.handle(regsub_msg("a/*"))
    engine.handle(
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", "$SYS/STREAM/S1/x/#"), ("QName", "SUB2.Q")],
            reply_to_q="R",
        )
    )
    usr = Element.from_pairs("usr", {"k": "v"})
    engine.handle(
        rfh2_message(
            DEFAULT,
            [("Command", "Publish"), ("Topic", "a/b"), ("PubOpt", "RetainPub")],
            b"kept",
            folders=[usr],
        )
    )
    engine.commit()
    engine.store.close()

    again = PubSubEngine("QM1", SqliteStore(path))
    subs = sorted((s.stream, s.topic, s.scheme, s.fmt) for s in again.subscriptions)
    assert subs == [
        ("S1", "x/#", Scheme.TOPIC, SubFormat.RFH2),
        (DEFAULT, "a/*", Scheme.CHAR, SubFormat.RFH),
    ]
    [ret] = again.retained()
    assert (ret.topic, ret.publication.payload) == ("a/b", b"kept")
    assert ret.publication.extra_folders == [usr.to_xml()]
    out = again.handle(regsub_msg("a/?", "NEW.Q"))
    got = decode(out.deliveries[0].md, out.deliveries[0].body)
    assert got.payload == b"kept" and got.topic == "a/b"
    again.store.close()


def test_uncommitted_changes_are_not_stored_and_rollback_restores_memory(
    store: PubSubStore,
) -> None:
    engine = PubSubEngine("QM1", store)
    engine.handle(regsub_msg("keep"))
    engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "r"), ("MQPSPubOpts", "RetainPub")],
            b"v1",
        )
    )
    engine.commit()
    engine.handle(regsub_msg("dropped"))
    engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "r"), ("MQPSPubOpts", "RetainPub")],
            b"v2",
        )
    )
    engine.handle(
        rfh_message(
            CONTROL, [("MQPSCommand", "DeregSub"), ("MQPSTopic", "keep"), ("MQPSQName", "SUB.Q")]
        )
    )
    assert sorted(s.topic for s in engine.subscriptions) == ["dropped"]
    engine.rollback()
    assert [s.topic for s in engine.subscriptions] == ["keep"]
    assert engine.retained()[0].publication.payload == b"v1"
    # the index was rolled back too
    out = engine.handle(
        rfh_message(DEFAULT, [("MQPSCommand", "Publish"), ("MQPSTopic", "dropped")], b"x")
    )
    assert out.deliveries == []
    fresh = PubSubEngine("QM1", store)
    assert [s.topic for s in fresh.subscriptions] == ["keep"]
    assert fresh.retained()[0].publication.payload == b"v1"


def test_applying_a_batch_twice_is_harmless(store: PubSubStore) -> None:
    engine = PubSubEngine("QM1", store)
    engine.handle(regsub_msg("t"))
    engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "t"), ("MQPSPubOpts", "RetainPub")],
            b"x",
        )
    )
    batch = engine.pending_mutations
    store.apply(batch)
    store.apply(batch)
    snap = store.load()
    assert len(snap.subscriptions) == 1 and len(snap.retained) == 1


def test_replayed_command_after_crash_gets_its_first_answer(store: PubSubStore) -> None:
    """Store committed, MQ commit lost: the same DeregSub comes back and must answer OK."""
    engine = PubSubEngine("QM1", store)
    engine.handle(regsub_msg("t"))
    engine.commit()
    dereg = rfh_message(
        CONTROL,
        [("MQPSCommand", "DeregSub"), ("MQPSTopic", "t"), ("MQPSQName", "SUB.Q")],
        reply_to_q="R.Q",
        msg_type=MsgType.REQUEST,
    )
    first = engine.handle(dereg)
    engine.commit()  # ... and the process dies before MQCMIT: the message is backed out
    restarted = PubSubEngine("QM1", store)
    replay = restarted.handle(dereg)
    assert (first.comp_code, first.reason) == (0, 0)
    assert (replay.comp_code, replay.reason) == (0, 0)
    assert replay.dead_letter is None and restarted.subscriptions == []
    # a genuinely new DeregSub (new MsgId) for the same topic is refused
    other = rfh_message(
        CONTROL,
        [("MQPSCommand", "DeregSub"), ("MQPSTopic", "t"), ("MQPSQName", "SUB.Q")],
        reply_to_q="R.Q",
        msg_type=MsgType.REQUEST,
    )
    assert restarted.handle(other).reason == 3073


def test_replayed_registration_resends_retained(store: PubSubStore) -> None:
    engine = PubSubEngine("QM1", store)
    engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "t"), ("MQPSPubOpts", "RetainPub")],
            b"x",
        )
    )
    engine.commit()
    reg = regsub_msg("t")
    assert len(engine.handle(reg).deliveries) == 1
    engine.commit()
    restarted = PubSubEngine("QM1", store)
    # the first deliveries were backed out with the MQ unit of work: they come again
    assert len(restarted.handle(reg).deliveries) == 1
    assert len(restarted.subscriptions) == 1
