"""The retained copies of ``mqgw streams move`` (gateway/runtime/streams/move_retained.py)
as the new owner's pub/sub engine takes them."""

from __future__ import annotations

from pathlib import Path

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import Neighbour, NeighbourKind, NeighbourRole
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.streams.move_retained import retained_copies
from gateway.wire.mqmd import MQMD
from tests.support.pubsub_messages import rfh_publication

S = "PRICES"
NEIGHBOURS = {"QMA": Neighbour("QMA", NeighbourKind.GATEWAY, NeighbourRole.PARENT,
                               frozenset({S, DEFAULT_STREAM}))}


def old_owners_copies(tmp_path: Path) -> list[tuple[MQMD, bytes]]:
    store = SqliteStore(tmp_path / "qma.db")
    try:
        a = PubSubEngine("QMA", store)
        for topic, local in (("T/1", False), ("T/2", True)):
            opts = [("MQPSPubOpts", "RetainPub"), ("MQPSRegOpts", "Anon")]
            if local:
                opts.append(("MQPSRegOpts", "Local"))
            assert a.handle(rfh_publication(S, topic, topic.encode(), pairs=opts)).reason == 0
        a.commit()
        return retained_copies(a.retained(S), S, from_q_mgr="QMA", to_q_mgr="QMB")
    finally:
        store.close()


def test_copies_leave_out_local_publications_and_keep_the_msg_id(tmp_path: Path) -> None:
    copies = old_owners_copies(tmp_path)
    assert len(copies) == 1  # T/2 was published Local: it never leaves QMA


def test_a_copy_taken_again_after_a_crash_between_the_commits_is_delivered(
    tmp_path: Path,
) -> None:
    (md, body), = old_owners_copies(tmp_path)
    store = SqliteStore(tmp_path / "qmb.db")
    b = PubSubEngine("QMB", store, neighbours=NEIGHBOURS)
    b.subscribe_sink("kafka", f"$SYS/STREAM/{S}/#")
    b.commit()
    assert len(b.handle(InboundMessage(S, md, body)).deliveries) == 1
    b.commit()  # the store's commit; the process dies before the MQ commit
    store.close()
    again = PubSubEngine("QMB", SqliteStore(tmp_path / "qmb.db"), neighbours=NEIGHBOURS)
    assert len(again.handle(InboundMessage(S, md, body)).deliveries) == 1
