"""Analytics benchmark: rows/s of the traffic job next to a bare Spark Kafka read + count.

Produces up to 1,000,000 bridged records (the full contract header set, 100-byte values,
200 topics on one stream, put times spread over 10 minutes) into a two-partition topic of
a local Kafka broker with aiokafka (batched, lingering, bounded by --produce-seconds),
then on one local[2] SparkSession:

* bare: ``spark.read.format("kafka")`` of the topic and ``count()`` (run twice, the first
  as JVM warm-up; the second is reported);
* fair: the same read, the job's own header decode (``analytics.records.decode_records``)
  of the columns the traffic job uses, and a count that needs every decoded column (so
  Spark cannot prune the decode away) - what any job over the contract must do at least;
* traffic, in two runs of the job with ``availableNow`` into one output folder and
  checkpoint (header decoding, windowed aggregation with watermark, Parquet upsert of
  both tables): the first over the first ``--first-share`` of the records (produced
  first), writing the tables from nothing (first write: nothing to read or merge), then,
  after the rest is produced, the steady-state run over the rest into the tables that now
  exist (touched partitions read and merged), as a long-running job does every batch.
  The steady-state run and the first write are summary rows. Before the
  first write, the job runs once uncounted over the same records into scratch tables and
  checkpoint (as the bare read has its warm-up): the JVM's first streaming query,
  stateful aggregation, ``foreachBatch`` call-back and Parquet write cost several seconds
  once per process, whatever the tables hold; that cold run is printed as an info row
  (``--no-traffic-warm-up``: none, the first write is the cold run).

The bare warm-up counts the first part; the measured bare and the fair read count all
records. Prints records produced and produce rate, the rates and ratios (traffic/bare,
traffic/fair) and the Spark jobs of each traffic run. ``--profile`` also writes Spark's
event log and prints where the time went: per phase the Spark jobs' wall time and
executors' run/CPU time, per stage of each traffic run (first write, steady state) the
same, and per traffic run the streaming query's own batch durations (addBatch, ...).
Run: .venv/bin/python -m benchmarks.bench_analytics [--records N] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from analytics.job import JobOptions
from analytics.jobs import traffic
from analytics.records import decode_records
from analytics.runner import run_job
from analytics.source import KafkaInput, read_batch
from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, spark_session_conf

STREAM = "BENCH.STREAM"
TOPIC = "mqgw." + STREAM
TOPICS = 200
#: Issue 32: the first write into empty tables at least half as fast as read + decode.
FIRST_WRITE_GOAL = 0.5


async def produce(bootstrap: str, records: int, seconds: float, *, first: int = 0,
                  stop: int | None = None) -> tuple[int, float]:
    """Produce records ``first`` up to ``stop`` (all by default) of ``records`` within
    ``seconds`` (put times spread by the record's number over all ``records``); returns
    (count, elapsed). The topic is created by the call starting at record 0."""
    if first == 0:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(TOPIC, 2, 1)])
        finally:
            await admin.close()
    stop = records if stop is None else stop
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, acks=1,
                                max_batch_size=1 << 20, max_request_size=8 << 20)
    await producer.start()
    value = b"v" * 100
    t0 = T0
    keys = [f"BENCH/T{i:03d}".encode() for i in range(TOPICS)]
    fixed = [(b"mq.contract", b"1"), (b"mq.stream", STREAM.encode())]
    tail = [(b"mq.correlId", b"\0" * 24), (b"mq.userId", b"bench"), (b"mq.format", b"MQSTR"),
            (b"mq.encoding", b"546"), (b"mq.ccsid", b"1208"), (b"mq.persistence", b"1"),
            (b"mq.pubHeader", b"MQRFH2"), (b"mq.origin", b"bench")]
    fixed_s = [(k.decode(), v) for k, v in fixed]
    tail_s = [(k.decode(), v) for k, v in tail]
    started = time.monotonic()
    sent = first
    try:
        pending: list[asyncio.Future[object]] = []
        while sent < stop and time.monotonic() - started < seconds:
            for _ in range(min(5_000, stop - sent)):
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
    return sent - first, time.monotonic() - started


# Event times start 20 minutes before the benchmark; both produce calls share them.
T0 = (int(time.time() * 1000) // 60_000 - 20) * 60_000


def job_marker(spark: Any, name: str) -> int:
    """The id of a tiny Spark job run now: jobs between two markers are the runs'."""
    sc = spark.sparkContext
    sc.setJobGroup(name, "job counter")
    spark.range(1).count()
    sc.setJobGroup("bench", "bench")
    return max(sc.statusTracker().getJobIdsForGroup(name))


def fair_count(spark: Any, source: KafkaInput) -> int:
    """Read + the traffic job's header decode + count; every decoded column is used."""
    from pyspark.sql import functions as F

    decoded = decode_records(read_batch(spark, source))
    row = decoded.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count("stream").alias("streams"),
        F.count(F.coalesce(F.col("topic"), F.col("key"))).alias("topics"),
        F.count("kafka_topic").alias("kafka_topics"),
        F.count("event_time").alias("times"),
        F.sum("value_bytes").alias("bytes"),
    ).first()
    assert row is not None
    return int(row["rows"]) if row["streams"] == row["topics"] == row["times"] else -1


def timed(label: str, phases: list[tuple[str, float, float]], work: Any) -> tuple[Any, float]:
    """Run ``work()``; note the phase's wall-clock span (epoch ms) for the profile."""
    t0 = time.time() * 1000
    started = time.monotonic()
    result = work()
    took = time.monotonic() - started
    phases.append((label, t0, time.time() * 1000))
    return result, took


def _accum(info: dict[str, Any], name: str) -> float:
    for acc in info.get("Accumulables", []):
        if acc.get("Name") == name:
            return float(acc.get("Value", 0) or 0)
    return 0.0


def event_log_profile(log_dir: Path, phases: list[tuple[str, float, float]]) -> str:
    """Spark's own timings from the event log: per phase, per traffic stage, per batch."""
    events: list[dict[str, Any]] = []
    # Spark 4 writes a rolling log: a directory of events_<n>_... files (plus appstatus).
    for path in sorted(p for p in log_dir.rglob("*") if p.is_file()
                       and not p.name.startswith(("appstatus", "."))):
        with open(path, encoding="utf-8") as f:
            events += [json.loads(line) for line in f if line.strip()]
    stage_phase: dict[int, str] = {}
    jobs: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev["Event"] == "SparkListenerJobStart":
            when = float(ev["Submission Time"])
            phase = next((p for p, a, b in phases if a <= when <= b), "other")
            jobs[ev["Job ID"]] = {"phase": phase, "start": when}
            for sid in ev["Stage IDs"]:
                stage_phase[sid] = phase
        elif ev["Event"] == "SparkListenerJobEnd" and ev["Job ID"] in jobs:
            jobs[ev["Job ID"]]["end"] = float(ev["Completion Time"])
    per_phase: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for job in jobs.values():
        per_phase[job["phase"]][0] += 1
        per_phase[job["phase"]][1] += job.get("end", job["start"]) - job["start"]
    per_stage: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    for ev in events:
        if ev["Event"] != "SparkListenerStageCompleted":
            continue
        info = ev["Stage Info"]
        phase = stage_phase.get(info["Stage ID"], "other")
        run_ms = _accum(info, "internal.metrics.executorRunTime")
        cpu_ms = _accum(info, "internal.metrics.executorCpuTime") / 1e6
        per_phase[phase][2] += run_ms
        per_phase[phase][3] += cpu_ms
        if phase.startswith("traffic "):
            name = info["Stage Name"].split(" at ")[0]
            wall = float(info.get("Completion Time", 0)) - float(info.get("Submission Time", 0))
            row = per_stage[(phase, name)]
            row[0] += 1
            row[1] += wall
            row[2] += run_ms
            row[3] += cpu_ms
            row[4] += _accum(info, "internal.metrics.input.recordsRead")
    lines = ["spark profile (event log): phase        jobs   jobs wall s   exec run s   exec cpu s"]
    for phase, (n, wall, run_ms, cpu_ms) in per_phase.items():
        lines.append(f"  {phase:<30} {int(n):>5} {wall / 1000:>12.2f} {run_ms / 1000:>12.2f} "
                     f"{cpu_ms / 1000:>12.2f}")
    for traffic_phase in sorted({p for p, _ in per_stage}):
        lines.append(f"{traffic_phase} stages:{'':<{max(0, 14 - len(traffic_phase))}}  stages"
                     "  stage wall s  exec run s  exec cpu s  records in")
        for (phase, name), (n, wall, run_ms, cpu_ms, rec) in sorted(
                per_stage.items(), key=lambda kv: -kv[1][2]):
            if phase == traffic_phase:
                lines.append(f"  {name:<30} {int(n):>6} {wall / 1000:>12.2f} "
                             f"{run_ms / 1000:>11.2f} {cpu_ms / 1000:>11.2f} {int(rec):>11,}")
    # the streaming query's per-batch durations, by the traffic run the batch began in
    durations: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    batches: dict[str, int] = defaultdict(int)
    for ev in events:
        if ev["Event"].endswith("QueryProgressEvent"):
            progress = ev["progress"]
            began = _epoch_ms(progress.get("timestamp", ""))
            phase = next((p for p, a, b in phases if a <= began <= b), "other")
            batches[phase] += 1
            for key, ms in progress.get("durationMs", {}).items():
                durations[phase][key] += float(ms)
    for phase, spent in durations.items():
        parts = ", ".join(f"{k} {v / 1000:.2f} s" for k, v in
                          sorted(spent.items(), key=lambda kv: -kv[1]))
        lines.append(f"streaming query, {phase}, {batches[phase]} batches: {parts}")
    return "\n".join(lines)


def _epoch_ms(timestamp: str) -> float:
    """Epoch ms of a query progress ``timestamp`` (ISO 8601, UTC); 0 if unreadable."""
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000
    except ValueError:
        return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--produce-seconds", type=float, default=180.0)
    parser.add_argument("--first-share", type=float, default=0.2,
                        help="share of the records the first-write run gets (the rest: "
                             "the steady-state run, the summary row)")
    parser.add_argument("--no-traffic-warm-up", action="store_true",
                        help="no uncounted traffic run (into scratch tables) before the first "
                             "write: the first write then also pays the JVM's warm-up")
    parser.add_argument("--profile", action="store_true",
                        help="write Spark's event log and print per-phase/stage timings")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-analytics-"))
    broker = KafkaBroker(work / "kafka")
    spark = None
    try:
        broker.start()
        split = max(1, min(args.records - 1, int(args.records * args.first_share)))
        first, took = asyncio.run(produce(broker.bootstrap, args.records,
                                          args.produce_seconds * args.first_share, stop=split))
        print(f"produced {first:,} records (first part) in {took:.1f} s "
              f"({first / took:,.0f} records/s, aiokafka)"
              f"{'' if first == split else ' - stopped by --produce-seconds'}", flush=True)

        from pyspark.sql import SparkSession

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = SparkSession.builder
        conf = spark_session_conf(work / "spark", app_name="bench-analytics",
                                  driver_memory="4g")
        log_dir = work / "events"
        if args.profile:
            log_dir.mkdir()
            conf["spark.eventLog.enabled"] = "true"
            conf["spark.eventLog.dir"] = log_dir.as_uri()
            conf["spark.eventLog.compress"] = "false"  # plain JSON lines to read back
            conf["spark.eventLog.rolling.enabled"] = "false"
        for key, val in conf.items():
            builder = builder.config(key, val)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")

        source = KafkaInput(broker.bootstrap, topics=(TOPIC,))
        phases: list[tuple[str, float, float]] = []
        n, dt = timed("bare warm-up", phases, lambda: read_batch(spark, source).count())
        print(f"bare Kafka read + count (warm-up, first part): {n:,} rows in {dt:.1f} s "
              f"({n / dt:,.0f} rows/s)", flush=True)
        if n != first:
            print(f"error: bare count {n} != produced {first}", file=sys.stderr)
            return 1

        options = JobOptions(source=source, out=str(work / "out"))
        runs: dict[str, tuple[int, float, int, int]] = {}

        def traffic_run(name: str, into: str = "") -> tuple[int, float, int, int]:
            before = job_marker(spark, f"before-{name}")
            opts = JobOptions(source=source, out=str(work / into / "out")) if into else options
            with open(os.devnull, "w") as quiet:
                result, dt = timed(name, phases, lambda: run_job(
                    spark, "traffic", traffic.build, opts,
                    checkpoint=str(work / into / "ckpt"), once=True, out=quiet))
            jobs = job_marker(spark, f"after-{name}") - before - 1
            stats = result.stats["traffic"]
            print(f"traffic job {name} (availableNow): {stats.rows:,} rows in {dt:.1f} s, "
                  f"{stats.batches} batches, {jobs} Spark jobs ({stats.rows / dt:,.0f} rows/s)",
                  flush=True)
            return stats.rows, dt, stats.batches, jobs

        if not args.no_traffic_warm_up:
            runs["cold"] = traffic_run("traffic warm-up (cold)", into="warm-up")
        runs["first write"] = traffic_run("traffic first write")

        rest, took = asyncio.run(produce(broker.bootstrap, args.records,
                                         args.produce_seconds * (1 - args.first_share),
                                         first=split))
        count = first + rest
        print(f"produced {rest:,} records (rest) in {took:.1f} s ({rest / took:,.0f} records/s)"
              f"{'' if count == args.records else ' - stopped by --produce-seconds'}",
              flush=True)

        n, dt = timed("bare measured", phases, lambda: read_batch(spark, source).count())
        bare_rate = n / dt
        print(f"bare Kafka read + count (measured): {n:,} rows in {dt:.1f} s "
              f"({bare_rate:,.0f} rows/s)", flush=True)
        if n != count:
            print(f"error: bare count {n} != produced {count}", file=sys.stderr)
            return 1
        n, dt = timed("fair (read + decode + count)", phases, lambda: fair_count(spark, source))
        fair_rate = n / dt
        print(f"fair baseline, read + header decode + count: {n:,} rows in {dt:.1f} s "
              f"({fair_rate:,.0f} rows/s)", flush=True)
        if n != count:
            print(f"error: fair count {n} != produced {count}", file=sys.stderr)
            return 1

        runs["steady state"] = traffic_run("traffic steady state")
        rows = runs["first write"][0] + runs["steady state"][0]
        totals = spark.read.schema(traffic.STREAMS_SCHEMA).parquet(
            str(work / "out" / "traffic_streams")).groupBy().sum("messages").first()
        counted = int(totals[0]) if totals and totals[0] is not None else 0
        print(f"traffic_streams total messages: {counted:,} (expected {count:,})")
        first_rate = runs["first write"][0] / runs["first write"][1]
        job_rate = runs["steady state"][0] / runs["steady state"][1]
        for name, rate in (("first write", first_rate), ("steady state", job_rate)):
            print(f"ratio {name} traffic/bare: {rate / bare_rate:.2f}, "
                  f"traffic/fair: {rate / fair_rate:.2f} (fair/bare {fair_rate / bare_rate:.2f})")
        steady = "steady state: the run into existing tables"
        record(Row("Spark traffic job", job_rate, bare_rate, 0.7, unit="rows/s",
                   note=f"{steady}, vs bare Kafka read + count"))
        record(Row("Spark traffic job", job_rate, fair_rate, 0.7, unit="rows/s",
                   note=f"{steady}, vs read + header decode + count"))
        warm = "" if args.no_traffic_warm_up else ", after an uncounted warm-up run"
        record(Row("Spark traffic job, first write", first_rate, fair_rate, FIRST_WRITE_GOAL,
                   unit="rows/s",
                   note=f"first run into empty tables (no read, no merge){warm}, "
                        "vs read + decode"))
        if "cold" in runs:
            cold_rate = runs["cold"][0] / runs["cold"][1]
            print(f"ratio cold first run (the warm-up) traffic/fair: {cold_rate / fair_rate:.2f}")
            record(Row("Spark traffic job, cold first run", cold_rate, fair_rate, None,
                       kind="info", unit="rows/s",
                       note="the uncounted warm-up: first streaming run of the JVM, "
                            "into empty tables, vs read + decode"))
        if args.profile:
            spark.stop()  # flushes and closes the event log
            spark = None
            print(event_log_profile(log_dir, phases), flush=True)
        return 0 if counted == count and rows == count else 1
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
