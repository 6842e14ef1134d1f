"""The engine rules the plugins rely on, sans I/O: the origin rule (no bridging loops),
retained deletions reaching sinks, and the publisher's identity carried to sinks."""

from __future__ import annotations

from pathlib import Path

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import MemoryStore
from gateway.wire.folder import Element
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message

STOCK_ALL = "$SYS/STREAM/STOCK.STREAM/#"


def _engine() -> PubSubEngine:
    engine = PubSubEngine("QM1", MemoryStore(), clock=lambda: 1_700_000_000.0)
    for sink in ("kafka", "mqtt"):
        engine.subscribe_sink(sink, STOCK_ALL)
    engine.handle(
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", STOCK_ALL), ("QName", "SUB.Q")],
        )
    )
    engine.commit()
    return engine


def _from(origin: str, topic: str = "IBM", *, retain: bool = False, delete: bool = False):  # type: ignore[no-untyped-def]
    psc = [
        ("Command", "DeletePub" if delete else "Publish"),
        ("Topic", f"$SYS/STREAM/STOCK.STREAM/{topic}"),
    ]
    if retain:
        psc.append(("PubOpt", "RetainPub"))
    marker = Element.from_pairs("mqgw", {"Origin": origin})
    return rfh2_message("STOCK.STREAM", psc, b"" if delete else b"v", folders=[marker])


def test_origin_sink_is_skipped_others_get_it_and_the_marker_is_stripped() -> None:
    engine = _engine()
    out = engine.handle(_from("kafka"))
    dests = sorted(str(d.destination) for d in out.deliveries)
    assert dests == ["SUB.Q@QM1", "sink:mqtt"]
    mq = next(d for d in out.deliveries if not d.destination.is_sink)
    assert b"mqgw" not in mq.body and b"Origin" not in mq.body
    sink = next(d for d in out.deliveries if d.destination.is_sink)
    assert sink.publication.origin == "kafka" and sink.publication.extra_folders == []


def test_retained_publication_is_not_replayed_to_its_origin() -> None:
    engine = _engine()
    engine.handle(_from("kafka", retain=True))
    engine.commit()
    _, again = engine.subscribe_sink("kafka", "$SYS/STREAM/STOCK.STREAM/+")
    _, other = engine.subscribe_sink("mqtt", "$SYS/STREAM/STOCK.STREAM/+")
    assert again == [] and len(other) == 1 and other[0].retained


def test_delete_publication_reaches_sinks_only_flagged_deleted() -> None:
    engine = _engine()
    engine.handle(_from("mqtt", retain=True))
    engine.commit()
    out = engine.handle(_from("kafka", delete=True))
    assert [str(d.destination) for d in out.deliveries] == ["sink:mqtt"]  # not MQ, not origin
    [d] = out.deliveries
    assert d.deleted and d.retained and d.body == b""
    assert d.topic == "$SYS/STREAM/STOCK.STREAM/IBM"
    assert engine.retained("STOCK.STREAM") == []


def test_sinks_see_the_publishers_identity() -> None:
    engine = _engine()
    msg = rfh_message(
        "STOCK.STREAM",
        [("MQPSCommand", "Publish"), ("MQPSStreamName", "STOCK.STREAM"), ("MQPSTopic", "IBM")],
        b"1",
        correl_id=b"C" * 24,
        user_identifier="trader",
    )
    msg.md.put_date, msg.md.put_time = "20260101", "12000050"
    out = engine.handle(msg)
    sink = next(d for d in out.deliveries if d.destination.sink == "kafka")
    mq = next(d for d in out.deliveries if not d.destination.is_sink)
    pub = sink.publication
    assert (pub.msg_id, pub.correl_id, pub.user_identifier) == (msg.md.msg_id, b"C" * 24, "trader")
    assert (pub.put_date, pub.put_time, pub.header) == ("20260101", "12000050", "MQRFH")
    assert (sink.md.msg_id, sink.md.correl_id, sink.md.put_time) == (
        msg.md.msg_id,
        b"C" * 24,
        "12000050",
    )
    assert mq.md.msg_id != msg.md.msg_id  # MQ subscribers keep the broker's identity


def test_new_publication_fields_survive_the_sqlite_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "ps.db")
    engine = PubSubEngine("QM1", store)
    engine.handle(_from("kafka", retain=True))
    engine.commit()
    store.close()
    store = SqliteStore(tmp_path / "ps.db")
    try:
        [ret] = PubSubEngine("QM1", store).retained("STOCK.STREAM")
        pub = ret.publication
        assert pub.origin == "kafka" and pub.header == "MQRFH2" and len(pub.msg_id) == 24
    finally:
        store.close()
