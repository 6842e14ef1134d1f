"""Analytics benchmark: rows/s of the traffic job next to a bare Spark Kafka read + count.

Produces up to 1,000,000 bridged records (the full contract header set, 100-byte values,
200 topics on one stream, put times spread over 10 minutes) into a two-partition topic of
a local Kafka broker with aiokafka (batched, lingering, bounded by --produce-seconds),
then on one local[2] SparkSession:

* bare: ``spark.read.format("kafka")`` of the topic and ``count()`` (run twice, the first
  as JVM warm-up; the second is reported);
* traffic: the traffic job with ``availableNow`` over the same topic (header decoding,
  windowed aggregation with watermark, Parquet upsert of both tables).

Prints records produced and produce rate, both rates and traffic/bare ratio.
Run: .venv/bin/python benchmarks/bench_analytics.py [--records N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from analytics.job import JobOptions
from analytics.jobs import traffic
from analytics.runner import run_job
from analytics.source import KafkaInput, read_batch
from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, spark_session_conf

STREAM = "BENCH.STREAM"
TOPIC = "mqgw." + STREAM
TOPICS = 200


async def produce(bootstrap: str, records: int, seconds: float) -> tuple[int, float]:
    """Produce up to ``records`` within ``seconds``; returns (count, elapsed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, acks=1,
                                max_batch_size=1 << 20, max_request_size=8 << 20)
    await producer.start()
    value = b"v" * 100
    t0 = (int(time.time() * 1000) // 60_000 - 20) * 60_000
    keys = [f"BENCH/T{i:03d}".encode() for i in range(TOPICS)]
    fixed = [(b"mq.contract", b"1"), (b"mq.stream", STREAM.encode())]
    tail = [(b"mq.correlId", b"\0" * 24), (b"mq.userId", b"bench"), (b"mq.format", b"MQSTR"),
            (b"mq.encoding", b"546"), (b"mq.ccsid", b"1208"), (b"mq.persistence", b"1"),
            (b"mq.pubHeader", b"MQRFH2"), (b"mq.origin", b"bench")]
    fixed_s = [(k.decode(), v) for k, v in fixed]
    tail_s = [(k.decode(), v) for k, v in tail]
    started = time.monotonic()
    sent = 0
    try:
        pending: list[asyncio.Future[object]] = []
        while sent < records and time.monotonic() - started < seconds:
            for _ in range(min(5_000, records - sent)):
                key = keys[sent % TOPICS]
                put = t0 + (sent * 600_000) // records
                headers = [*fixed_s, ("mq.topic", key), ("mq.msgId", sent.to_bytes(24, "big")),
                           ("mq.putTime", str(put).encode()), *tail_s]
                pending.append(await producer.send(TOPIC, value=value, key=key,
                                                   headers=headers, timestamp_ms=put + 7))
                sent += 1
            if len(pending) >= 50_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    return sent, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--produce-seconds", type=float, default=180.0)
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-analytics-"))
    broker = KafkaBroker(work / "kafka")
    spark = None
    try:
        broker.start()
        count, took = asyncio.run(produce(broker.bootstrap, args.records, args.produce_seconds))
        print(f"produced {count:,} records in {took:.1f} s ({count / took:,.0f} records/s, "
              f"aiokafka){'' if count == args.records else ' - stopped by --produce-seconds'}",
              flush=True)

        from pyspark.sql import SparkSession

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = SparkSession.builder
        conf = spark_session_conf(work / "spark", app_name="bench-analytics",
                                  driver_memory="4g")
        for key, val in conf.items():
            builder = builder.config(key, val)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")

        source = KafkaInput(broker.bootstrap, topics=(TOPIC,))
        bare_rate = 0.0
        for attempt in ("warm-up", "measured"):
            t = time.monotonic()
            n = read_batch(spark, source).count()
            dt = time.monotonic() - t
            bare_rate = n / dt
            print(f"bare Kafka read + count ({attempt}): {n:,} rows in {dt:.1f} s "
                  f"({bare_rate:,.0f} rows/s)", flush=True)
            if n != count:
                print(f"error: bare count {n} != produced {count}", file=sys.stderr)
                return 1

        options = JobOptions(source=source, out=str(work / "out"))
        t = time.monotonic()
        with open(os.devnull, "w") as quiet:
            result = run_job(spark, "traffic", traffic.build, options,
                             checkpoint=str(work / "ckpt"), once=True, out=quiet)
        dt = time.monotonic() - t
        rows = result.stats["traffic"].rows
        batches = result.stats["traffic"].batches
        job_rate = rows / dt
        print(f"traffic job (availableNow): {rows:,} rows in {dt:.1f} s, {batches} batches "
              f"({job_rate:,.0f} rows/s)", flush=True)
        totals = spark.read.schema(traffic.STREAMS_SCHEMA).parquet(
            str(work / "out" / "traffic_streams")).groupBy().sum("messages").first()
        counted = int(totals[0]) if totals and totals[0] is not None else 0
        print(f"traffic_streams total messages: {counted:,} (expected {count:,})")
        print(f"ratio traffic/bare: {job_rate / bare_rate:.2f}")
        record(Row("Spark traffic job", job_rate, bare_rate, 0.7, unit="rows/s",
                   note="vs bare Kafka read + count"))
        return 0 if counted == count and rows == count else 1
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
