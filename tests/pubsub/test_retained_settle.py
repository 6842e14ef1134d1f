"""A neighbour's retained copy is *unsettled* until the MQ unit of work that carried it
has committed (docs/neighbours.md, "Retained copies"): the store commits first,
so a forward that comes again after a failed MQ commit or a crash between the two is
delivered, not taken for a replay of the copy it left in the store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import NeighbourKind
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import Destination
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import MemoryStore, PubSubStore
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.wire.constants import CompCode, MsgType
from tests.pubsub.test_engine_neighbours import BULLETIN, nb
from tests.pubsub.test_engine_neighbours_review import v6_publication
from tests.support.pubsub_messages import rfh_message

LOCAL = Destination("GW", "LOCAL.GW")


def gateway(store: PubSubStore) -> PubSubEngine:
    """GW, neighbour of QMA, with a local subscriber on ``news`` (committed)."""
    gw = PubSubEngine("GW", store, neighbours={"QMA": nb("QMA", NeighbourKind.MQPUBSUB)})
    if not gw.subscriptions:
        subscribe(gw, "news")
        gw.commit()
    return gw


def subscribe(gw: PubSubEngine, topic: str) -> None:
    out = gw.handle(
        rfh_message(
            CONTROL_QUEUE,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", BULLETIN),
                ("MQPSTopic", topic),
                ("MQPSQMgrName", "GW"),
                ("MQPSQName", "LOCAL.GW"),
            ],
            reply_to_q_mgr="GW",
            msg_type=MsgType.REQUEST,
            reply_to_q="R.Q",
        )
    )
    assert out.comp_code == CompCode.OK, out


def forward(payload: bytes) -> InboundMessage:
    """QMA's retained publication as a legacy broker sends it (IsRetainedPub)."""
    return v6_publication("QMA", ("MQPSPubOpts", "IsRetainedPub"), payload=payload)


def delivered(gw: PubSubEngine, msg: InboundMessage) -> list[Destination]:
    out = gw.handle(msg)
    assert out.comp_code == CompCode.OK and out.dead_letter is None, out
    return [d.destination for d in out.deliveries]


def test_a_forward_whose_mq_commit_failed_is_delivered_when_it_comes_again() -> None:
    gw = gateway(MemoryStore())
    assert delivered(gw, forward(b"held")) == [LOCAL]
    gw.commit()  # the store's commit; MQ's fails: the unit is backed out, nothing settled
    gw.rollback()
    assert delivered(gw, forward(b"held")) == [LOCAL]  # the subscriber's backed-out copy
    gw.settle_retained(gw.commit())  # this time MQ's commit worked
    assert delivered(gw, forward(b"held")) == []  # a replay now: never delivered twice


def test_a_settle_leaves_a_newer_copy_of_the_topic_unsettled() -> None:
    gw = gateway(MemoryStore())
    assert delivered(gw, forward(b"first")) == [LOCAL]
    first = gw.commit()  # its MQ commit still in flight ...
    assert delivered(gw, forward(b"second")) == [LOCAL]
    second = gw.commit()
    gw.settle_retained(first)  # ... ends after the next batch stored a newer copy
    assert delivered(gw, forward(b"second")) == [LOCAL]  # that one is not settled yet
    gw.settle_retained(second)
    gw.settle_retained(gw.commit())
    assert delivered(gw, forward(b"second")) == []


def test_the_mark_survives_a_restart_and_its_settle_rides_the_next_batch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gw.db"
    store = SqliteStore(path)
    gw = gateway(store)
    assert delivered(gw, forward(b"held")) == [LOCAL]
    gw.commit()
    store.close()  # the process dies before the MQ commit

    store = SqliteStore(path)
    gw = gateway(store)
    [held] = gw.retained(BULLETIN)
    assert held.unsettled
    assert delivered(gw, forward(b"held")) == [LOCAL]  # the forward came again
    gw.settle_retained(gw.commit())
    # the settle costs no write of its own ...
    unsettled = store_rows(path)
    assert unsettled == [("news", 1)]
    subscribe(gw, "other")
    gw.commit()  # ... it rides the next batch written
    assert store_rows(path) == [("news", 0)]
    store.close()

    store = SqliteStore(path)
    gw = gateway(store)
    assert delivered(gw, forward(b"held")) == []  # a replay after the restart
    store.close()


def store_rows(path: Path) -> list[tuple[str, int]]:
    """(topic, unsettled as 0/1) of the retained rows committed in ``path``."""
    db = sqlite3.connect(path)
    try:
        return [
            (str(t), int(bool(u)))
            for t, u in db.execute("SELECT topic, unsettled FROM retained ORDER BY topic")
        ]
    finally:
        db.close()


def test_a_store_written_before_the_mark_loads_its_copies_settled(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SqliteStore(path)
    gw = gateway(store)
    assert delivered(gw, forward(b"held")) == [LOCAL]
    gw.settle_retained(gw.commit())
    subscribe(gw, "other")
    gw.commit()
    store.close()
    db = sqlite3.connect(path)  # the table as an older version wrote it
    db.execute("ALTER TABLE retained DROP COLUMN unsettled")
    db.commit()
    db.close()

    store = SqliteStore(path)
    gw = gateway(store)
    [held] = gw.retained(BULLETIN)
    assert held.unsettled == 0
    assert delivered(gw, forward(b"held")) == []
    store.close()
