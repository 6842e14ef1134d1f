"""quality over real Kafka and local Spark: duplicates, dead letters, contract violations."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics.job import JobOptions
from analytics.jobs import quality
from analytics.runner import run_job
from analytics.source import KafkaInput
from tests.analytics.bridged import Publication, hour_start_ms, msg_id, produce, produce_raw, unique

MIN = 60_000


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)


def test_quality_finds_duplicates_deadletters_and_violations(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    t0 = hour_start_ms()
    stream = unique("QUALITY.")
    ktopic = f"mqgw.{stream}"
    dl_topic = unique("mqgw-deadletter-")
    x, y = msg_id(1), msg_id(2)
    pubs = [Publication(stream, f"ok/{i}", b"fine", t0 + i * 10) for i in range(5)]
    pubs += [
        # X re-delivered twice (same MsgId and put time), Y once
        Publication(stream, "dup/x", b"x", t0 + 1_000, msg_id=x),
        Publication(stream, "dup/x", b"x", t0 + 1_000, msg_id=x),
        Publication(stream, "dup/y", b"y", t0 + 2_000, msg_id=y),
        Publication(stream, "dup/x", b"x", t0 + 1_000, msg_id=x),
        Publication(stream, "dup/y", b"y", t0 + 2_000, msg_id=y),
        # contract violations, one each
        Publication(stream, "bad/contract", b"b", t0 + 3_000, drop=("mq.contract",)),
        Publication(stream, "bad/msgid", b"b", t0 + 3_000,
                    override={"mq.msgId": b"short"}),
        Publication(stream, "bad/puttime", b"b", t0 + 3_000,
                    override={"mq.putTime": b"12:00:00"}),
        Publication(stream, "bad/key", b"b", t0 + 3_000, key="other/key"),
        Publication(stream, "bad/dup", b"b", t0 + 3_000,
                    extra=[("mq.stream", stream.encode())]),
        Publication(stream, "bad/pubheader", b"b", t0 + 3_000,
                    override={"mq.pubHeader": b"MQMD"}),
        # no stream header: counted under a null stream (the default partition)
        Publication(stream, "bad/nostream", b"b", t0 + 3_000, drop=("mq.stream",)),
        # a tombstone has no msgId/putTime and that is fine
        Publication(stream, "ok/0", None, t0 + 4_000),
    ]
    produce(kafka_broker.bootstrap, ktopic, pubs)

    def dl(reason: int, dest: str, ts: int) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
        return (b"SYSTEM.BROKER.CONTROL.QUEUE", b"data", [
            ("mq.contract", b"1"), ("mq.origin", b"gw"), ("mq.msgId", msg_id(ts)),
            ("mq.putTime", str(ts).encode()), ("mq.dlh.reason", str(reason).encode()),
            ("mq.dlh.destQ", dest.encode()), ("mq.dlh.destQMgr", b"QM1"),
            ("mq.stream", stream.encode()),
        ], ts)

    produce_raw(kafka_broker.bootstrap, dl_topic, [
        dl(2085, "NO.SUCH.Q", t0 + 1), dl(2085, "NO.SUCH.Q", t0 + 2),
        dl(2085, "NO.SUCH.Q", t0 + 3), dl(2336, "SYSTEM.BROKER.CONTROL.QUEUE", t0 + 4),
        dl(2085, "NO.SUCH.Q", t0 + MIN + 1),
    ])

    source = KafkaInput(kafka_broker.bootstrap, topics=(ktopic,), max_offsets_per_trigger=6)
    options = JobOptions(source=source, out=str(tmp_path / "out"),
                         extra={"deadletter_topic": dl_topic})
    result = run_job(spark_session, "quality", quality.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["quality_duplicates"].rows == len(pubs)
    assert result.stats["quality_deadletter"].rows == 5

    out = tmp_path / "out"
    dups = spark_session.read.schema(quality.DUPLICATES_SCHEMA).parquet(
        str(out / "quality_duplicates")).collect()
    assert sorted((r.stream, r.msg_id_hex, r.copies, tuple(r.topics)) for r in dups) == [
        (stream, x.hex().upper(), 3, ("dup/x",)),
        (stream, y.hex().upper(), 2, ("dup/y",)),
    ]
    x_row = next(r for r in dups if r.msg_id_hex == x.hex().upper())
    assert (x_row.first_offset, x_row.last_offset) == (5, 8)

    dls = spark_session.read.schema(quality.DEADLETTER_SCHEMA).parquet(
        str(out / "quality_deadletter")).collect()
    assert sorted((r.window_start, r.reason, r.dest_q, r.messages) for r in dls) == [
        (_ts(t0), 2085, "NO.SUCH.Q", 3),
        (_ts(t0), 2336, "SYSTEM.BROKER.CONTROL.QUEUE", 1),
        (_ts(t0 + MIN), 2085, "NO.SUCH.Q", 1),
    ]
    assert {r.stream for r in dls} == {stream}

    viol = spark_session.read.schema(quality.VIOLATIONS_SCHEMA).parquet(
        str(out / "quality_violations")).collect()
    by_rule = {r.rule: r.records for r in viol}
    assert {r.stream for r in viol if r.rule == "stream_missing"} == {None}
    assert {r.stream for r in viol if r.rule != "stream_missing"} == {stream}
    assert by_rule == {
        "stream_missing": 1,
        "contract_version": 1,
        "msg_id_invalid": 1,
        "put_time_invalid": 1,
        "key_mismatch": 1,
        "duplicate_header": 1,
        "pub_header_invalid": 1,
    }
    examples = {r.rule: r.example_offset for r in viol}
    assert examples["contract_version"] == 10
    assert examples["pub_header_invalid"] == 15
