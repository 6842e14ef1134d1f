"""latency over real Kafka and local Spark: percentiles within one bucket, order, late."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analytics.job import JobOptions
from analytics.jobs import latency
from analytics.jobs.latency import bucket_upper_bound_py
from analytics.runner import run_job
from analytics.source import KafkaInput
from tests.analytics.bridged import Publication, hour_start_ms, produce, unique

MIN = 60_000


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)


def _nearest_rank(values: list[int], pct: int) -> int:
    ordered = sorted(values)
    return ordered[math.ceil(len(ordered) * pct / 100) - 1]


def test_latency_percentiles_order_and_late(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    t0 = hour_start_ms()
    stream = unique("LATENCY.")
    ktopic = f"mqgw.{stream}"
    pubs: list[Publication] = []
    # Minute 0: latencies 1..100 ms, one per record -> p50 50, p95 95, p99 99, max 100.
    lat0 = list(range(1, 101))
    for i, lat in enumerate(lat0):
        put = t0 + i * 100
        pubs.append(Publication(stream, "A/lin", b"v", put, kafka_ms=put + lat))
    # Minute 1: a spread that crosses bucket widths, one negative (clock skew).
    lat1 = [3, 150, 151, 1234, 987, 45_000, 70_000, 70_001, 5, 2_500, -4, 12_345]
    for i, lat in enumerate(lat1):
        put = t0 + MIN + i * 1_000
        pubs.append(Publication(stream, "B/mixed", b"v", put, kafka_ms=put + lat))
    # Topic C: put times 0, 10, 5, 20, 15, 30 (ms offsets) -> 2 out of order, one of them
    # in a later micro-batch than the record it is behind.
    order = [0, 10, 5, 20, 15, 30]
    for off in order:
        put = t0 + 2 * MIN + off
        pubs.append(Publication(stream, "C/order", b"v", put, kafka_ms=put + 1))
    # a tombstone carries no put time and is ignored by this job
    pubs.append(Publication(stream, "A/lin", None, t0 + 2 * MIN))
    produce(kafka_broker.bootstrap, ktopic, pubs)

    source = KafkaInput(kafka_broker.bootstrap, topics=(ktopic,), max_offsets_per_trigger=38)
    options = JobOptions(source=source, out=str(tmp_path / "out"),
                         extra={"late_after_ms": "60000"})
    result = run_job(spark_session, "latency", latency.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["latency_order"].rows == len(pubs)
    assert result.stats["latency_order"].batches >= 3

    rows = spark_session.read.schema(latency.LATENCY_SCHEMA).parquet(
        str(tmp_path / "out" / "latency")).collect()
    by_window = {r.window_start: r for r in rows if r.stream == stream}
    assert len(by_window) == 3

    w0 = by_window[_ts(t0)]
    assert (w0.records, w0.p50_ms, w0.p95_ms, w0.p99_ms, w0.max_ms, w0.min_ms) == (
        100, 50, 95, 99, 100, 1)

    w1 = by_window[_ts(t0 + MIN)]
    assert (w1.records, w1.negative, w1.max_ms, w1.min_ms) == (12, 1, 70_001, -4)
    for name, pct in (("p50_ms", 50), ("p95_ms", 95), ("p99_ms", 99)):
        exact = _nearest_rank(lat1, pct)
        reported = getattr(w1, name)
        # within one bucket: the reported value is the exact value's bucket bound
        assert exact <= reported <= bucket_upper_bound_py(exact), (name, exact, reported)
    assert w1.p50_ms == bucket_upper_bound_py(_nearest_rank(lat1, 50)) == 990

    w2 = by_window[_ts(t0 + 2 * MIN)]
    assert (w2.records, w2.p50_ms, w2.max_ms) == (6, 1, 1)

    orders = spark_session.read.schema(latency.ORDER_SCHEMA).parquet(
        str(tmp_path / "out" / "latency_order")).collect()
    totals: dict[tuple[str, datetime], list[int]] = {}
    for r in orders:
        if r.stream != stream:
            continue
        t = totals.setdefault((r.topic, r.window_start), [0, 0, 0])
        t[0] += r.records
        t[1] += r.out_of_order
        t[2] += r.late
    assert totals == {
        ("A/lin", _ts(t0)): [100, 0, 0],
        ("B/mixed", _ts(t0 + MIN)): [12, 0, sum(1 for x in lat1 if x > 60_000)],
        ("C/order", _ts(t0 + 2 * MIN)): [6, 2, 0],
    }
    # the order state really carried over between batches: C/order spans two batches
    c_batches = {r.batch_id for r in orders if r.topic == "C/order"}
    assert len(c_batches) == 2
