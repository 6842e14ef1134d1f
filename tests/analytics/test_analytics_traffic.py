"""traffic over real Kafka and local Spark: exact counts per window, watermark, top topics."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics.job import JobOptions
from analytics.jobs import traffic
from analytics.runner import run_job
from analytics.source import KafkaInput
from tests.analytics.bridged import Publication, hour_start_ms, produce, unique

MIN = 60_000


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)


def test_traffic_counts_per_window_and_top_topics(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    t0 = hour_start_ms()
    s1, s2 = unique("TRAFFIC.A"), unique("TRAFFIC.B")
    k1, k2 = f"mqgw.{s1}", f"mqgw.{s2}"
    pubs1 = [
        Publication(s1, "IBM/Latest", b"x" * 10, t0 + 1_000),
        Publication(s1, "IBM/Latest", b"x" * 20, t0 + 2_000),
        Publication(s1, "HPQ/Latest", b"x" * 5, t0 + 3_000),
        Publication(s1, "IBM/Latest", b"x" * 30, t0 + 59_990),
        Publication(s1, "IBM/Latest", b"y" * 7, t0 + MIN),  # first ms of minute 1
        Publication(s1, "SUN/Latest", b"z" * 100, t0 + MIN + 5_000),
        Publication(s1, "HPQ/Latest", b"y" * 8, t0 + 30 * MIN),  # moves the watermark
        Publication(s1, "HPQ/Latest", b"y" * 9, t0 + 30 * MIN + 1),
    ]
    # Produced after the first run: behind the 10-minute watermark the checkpoint holds,
    # so the second run drops it; the one after it still counts.
    later = [
        Publication(s1, "IBM/Latest", b"late", t0 + 2_000),
        Publication(s1, "HPQ/Latest", b"w" * 4, t0 + 30 * MIN + 2),
    ]
    pubs2 = [Publication(s2, f"T/{i % 3}", b"q" * i, t0 + i * 1_000) for i in range(1, 13)]
    produce(kafka_broker.bootstrap, k1, pubs1)
    produce(kafka_broker.bootstrap, k2, pubs2)

    # Four records per micro-batch: windows are merged across batches.
    source = KafkaInput(kafka_broker.bootstrap, topics=(k1, k2), max_offsets_per_trigger=4)
    options = JobOptions(source=source, out=str(tmp_path / "out"), extra={"top": "2"})
    result = run_job(spark_session, "traffic", traffic.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["traffic"].rows == len(pubs1) + len(pubs2)
    assert result.stats["traffic"].batches >= 3
    # A second run resumes from the checkpoint and reads only the new records.
    produce(kafka_broker.bootstrap, k1, later)
    result = run_job(spark_session, "traffic", traffic.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["traffic"].rows == len(later)

    rows = spark_session.read.schema(traffic.TOPICS_SCHEMA).parquet(
        str(tmp_path / "out" / "traffic_topics")).collect()
    got = {(r.stream, r.kafka_topic, r.topic, r.window_start): (r.messages, r.bytes)
           for r in rows}

    # Expected, computed from the inputs by hand-rule: minute window of the put time.
    # The one late record (put t0+2s, after the t0+30min record) is excluded.
    kept = pubs1 + pubs2 + later[1:]
    expect: dict[tuple[str, str, str, datetime], list[int]] = {}
    for p in kept:
        k = (p.stream, f"mqgw.{p.stream}", p.topic, _ts(p.put_ms // MIN * MIN))
        e = expect.setdefault(k, [0, 0])
        e[0] += 1
        e[1] += len(p.value or b"")
    assert got == {k: tuple(v) for k, v in expect.items()}
    # Spot checks written out: IBM in minute 0 of stream A is 3 messages, 60 bytes.
    assert got[(s1, k1, "IBM/Latest", _ts(t0))] == (3, 60)
    assert got[(s1, k1, "HPQ/Latest", _ts(t0 + 30 * MIN))] == (3, 21)

    streams = spark_session.read.schema(traffic.STREAMS_SCHEMA).parquet(
        str(tmp_path / "out" / "traffic_streams")).collect()
    by_stream = {(r.stream, r.window_start): r for r in streams}
    a0 = by_stream[(s1, _ts(t0))]
    assert (a0.messages, a0.bytes, a0.topics) == (4, 65, 2)
    assert [t.topic for t in a0.top_topics] == ["IBM/Latest", "HPQ/Latest"]
    b0 = by_stream[(s2, _ts(t0))]
    per_topic = Counter(p.topic for p in pubs2)
    assert (b0.messages, b0.topics) == (12, 3)
    assert set(per_topic.values()) == {4}
    # Equal counts (4 each): bytes decide. T/0 has 3+6+9+12 = 30, T/2 26, T/1 22.
    size: Counter[str] = Counter()
    for p in pubs2:
        size[p.topic] += len(p.value or b"")
    ranked = sorted(size, key=lambda t: (-per_topic[t], -size[t], t))[:2]
    assert ranked == ["T/0", "T/2"]
    assert [(t.topic, t.messages, t.bytes) for t in b0.top_topics] == [
        (t, per_topic[t], size[t]) for t in ranked]
    assert len(streams) == 4
    dates = {r.date for r in streams}
    assert dates == {_ts(t0).date()} | {_ts(t0 + 30 * MIN).date()}
