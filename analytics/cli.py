"""``mqgw analytics <job>``: run an analytics job on a local SparkSession (or under spark-submit).

Registration imports nothing heavy: pyspark and the job modules load inside ``func``.
The same parser serves ``python -m analytics`` / ``spark-submit analytics/__main__.py``,
where the session comes from spark-submit (``--packages`` supplies the connector) instead
of the project's locally resolved jars.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from analytics import AnalyticsError
from analytics import contract as c
from analytics.jobs import JOB_NAMES

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
_PUBLICATIONS_PATTERN = c.PUBLICATION_PREFIX.replace(".", r"\.") + ".*"
_RETAINED_PATTERN = c.RETAINED_PREFIX.replace(".", r"\.") + ".*"

DEFAULT_INPUT: dict[str, tuple[str, str]] = {
    # job: (kind, value) where kind is "pattern" or "topics"
    "traffic": ("pattern", _PUBLICATIONS_PATTERN),
    "latency": ("pattern", _PUBLICATIONS_PATTERN),
    "lastvalue": ("pattern", _RETAINED_PATTERN),
    "quality": ("pattern", _PUBLICATIONS_PATTERN),
    "ohlc": ("topics", c.publication_topic("STOCK.STREAM")),
}

HELP = {
    "traffic": "messages and bytes per stream/topic per window, top topics",
    "latency": "put time -> Kafka latency percentiles, out-of-order and late arrivals",
    "lastvalue": "latest publication per (stream, topic), honouring retained deletes",
    "quality": "duplicate MsgIds, dead-letter counts, contract violations",
    "ohlc": "1-minute OHLCV bars per symbol from tick publications (Parquet + Kafka)",
}


def _common(p: argparse.ArgumentParser, job: str) -> None:
    kind, value = DEFAULT_INPUT[job]
    p.add_argument("--bootstrap", default=os.environ.get("MQGW_KAFKA_BOOTSTRAP",
                                                         DEFAULT_BOOTSTRAP),
                   help="Kafka bootstrap servers (default $MQGW_KAFKA_BOOTSTRAP or "
                   f"{DEFAULT_BOOTSTRAP})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--topics", help="comma-separated Kafka topics "
                     + (f"(default {value})" if kind == "topics" else ""))
    src.add_argument("--pattern", help="Java regex of Kafka topics "
                     + (f"(default {value})" if kind == "pattern" else ""))
    p.add_argument("--out", required=True, help="output directory (local path or URI)")
    p.add_argument("--checkpoint", help="checkpoint directory (default <out>/_checkpoints/"
                   f"{job})")
    p.add_argument("--once", action="store_true",
                   help="process what the topics hold now (availableNow) and exit")
    p.add_argument("--trigger", default="10 seconds", help="micro-batch interval when "
                   "running continuously (default %(default)s)")
    p.add_argument("--window", default="1 minute", help="window length (default %(default)s)")
    p.add_argument("--watermark", default="10 minutes",
                   help="how late a record may arrive and still count (default %(default)s)")
    p.add_argument("--starting-offsets", default="earliest",
                   help="where a first run starts: earliest, latest or JSON (default "
                   "%(default)s; later runs resume from the checkpoint)")
    p.add_argument("--max-offsets-per-trigger", type=int,
                   help="cap records per micro-batch")
    p.add_argument("--fail-on-data-loss", choices=("true", "false"),
                   default="false" if job == "lastvalue" else "true",
                   help="fail when Kafka already deleted offsets to read (default %(default)s)")
    p.add_argument("--console", action="store_true", help="also print each batch's results")
    p.add_argument("--master", default=os.environ.get("MQGW_SPARK_MASTER", "local[2]"),
                   help="Spark master for the local session (default: $MQGW_SPARK_MASTER, "
                   "else local[2])")
    p.add_argument("--progress-interval", type=float, default=1.0,
                   help="seconds between progress checks (default %(default)s)")


def register(subparsers: Any) -> None:
    """Add ``analytics`` and its job sub-commands to the ``mqgw`` parser."""
    parser = subparsers.add_parser(
        "analytics", help="Spark analytics over the bridged Kafka topics",
        description="Run a PySpark Structured Streaming job over the Kafka topics the "
        "gateway writes (docs/analytics.md).")
    jobs = parser.add_subparsers(dest="job", metavar="JOB", required=True)
    for job in JOB_NAMES:
        p = jobs.add_parser(job, help=HELP[job], description=HELP[job])
        _common(p, job)
        if job == "traffic":
            p.add_argument("--top", type=int, default=10, help="top topics kept per stream")
        elif job == "latency":
            p.add_argument("--late-after-ms", type=int, default=60_000,
                           help="latency above which a record counts as late")
        elif job == "quality":
            p.add_argument("--deadletter-topic", default=c.DEADLETTER_TOPIC,
                           help="dead-letter topic ('' to skip; default %(default)s)")
            p.add_argument("--dup-window", default="1 hour",
                           help="put-time window within which MsgIds are compared")
        elif job == "ohlc":
            p.add_argument("--stream", default="STOCK.STREAM", help="the tick stream")
            p.add_argument("--bars-topic", default="mqgw-analytics.ohlc",
                           help="Kafka topic the bars are produced to ('' for none)")
            p.add_argument("--bars-stream", default="STOCK.STREAM",
                           help="mq.stream of the produced bars")
            p.add_argument("--bars-mq-topic", default="OHLC/1m/{symbol}",
                           help="mq.topic template of the produced bars")
        p.set_defaults(func=run_local, exit_codes=(
            (0, "done (--once) or stopped"),
            (1, "the job could not run (Spark, Kafka or its options)"),
            (130, "interrupted (Ctrl-C)"),
        ))


def _extra(args: argparse.Namespace) -> dict[str, str]:
    names = ("top", "late_after_ms", "deadletter_topic", "dup_window", "stream",
             "bars_topic", "bars_stream", "bars_mq_topic")
    return {n: str(getattr(args, n)) for n in names if hasattr(args, n)}


def job_options(args: argparse.Namespace) -> tuple[Any, str]:
    """The job's options and checkpoint directory from parsed arguments."""
    from analytics.job import JobOptions
    from analytics.source import KafkaInput

    kind, value = DEFAULT_INPUT[args.job]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    if args.topics:
        topics = tuple(t.strip() for t in args.topics.split(",") if t.strip())
    elif args.pattern:
        pattern = args.pattern
    elif kind == "topics":
        topics = (value,)
    else:
        pattern = value
    source = KafkaInput(
        bootstrap=args.bootstrap, topics=topics, pattern=pattern,
        starting_offsets=args.starting_offsets,
        fail_on_data_loss=args.fail_on_data_loss == "true",
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    options = JobOptions(source=source, out=args.out, window=args.window,
                         watermark=args.watermark, console=args.console, extra=_extra(args))
    checkpoint = args.checkpoint or f"{args.out.rstrip('/')}/_checkpoints/{args.job}"
    return options, checkpoint


def _local_session(args: argparse.Namespace) -> Any:
    """A local SparkSession with the connector jars ``make setup`` resolved."""
    from pyspark.sql import SparkSession

    from gateway.devstack import spark_session_conf  # local runs only (see tests/test_layering)

    work = Path(tempfile.mkdtemp(prefix="mqgw-analytics-"))
    args.work_dir = work  # removed when the run ends
    conf = spark_session_conf(work, app_name=f"mqgw-analytics-{args.job}", master=args.master)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    quiet_spark_warnings(spark)
    return spark


def quiet_spark_warnings(spark: Any) -> None:
    """Silence a WARN Spark logs on every ``localCheckpoint`` the table merges use.

    Best effort: on a cluster with another logging back end this does nothing.
    """
    try:
        jvm = spark._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.LogicalRDD", level)
    except Exception:  # logging tweaks never stop a job
        return


def _submitted_session(args: argparse.Namespace) -> Any:
    """The session spark-submit configured (master, --packages); UTC for date partitions."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"mqgw-analytics-{args.job}").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.sparkContext.setLogLevel(os.environ.get("MQGW_SPARK_LOG_LEVEL", "WARN"))
    quiet_spark_warnings(spark)
    return spark


def execute(args: argparse.Namespace, spark: Any) -> int:
    """Run the parsed job on ``spark``; 0 when done, 130 after Ctrl-C, 1 on failure."""
    from analytics.runner import run_job

    options, checkpoint = job_options(args)
    module = importlib.import_module(f"analytics.jobs.{args.job}")
    mode = "once (availableNow)" if args.once else f"every {args.trigger}"
    print(f"[{args.job}] reading {options.source.topics or options.source.pattern} from "
          f"{options.source.bootstrap}, {mode}, out {options.out}", flush=True)
    result = run_job(spark, args.job, module.build, options, checkpoint=checkpoint,
                     once=args.once, trigger=args.trigger,
                     poll_seconds=args.progress_interval)
    totals = ", ".join(f"{name}: {s.batches} batches, {s.rows} rows"
                       for name, s in result.stats.items())
    print(f"[{args.job}] {'stopped' if result.interrupted else 'done'}: {totals}", flush=True)
    return 130 if result.interrupted else 0


def _run(args: argparse.Namespace, local: bool) -> int:
    spark = None
    try:
        spark = _local_session(args) if local else _submitted_session(args)
        return execute(args, spark)
    except AnalyticsError as exc:
        print(f"mqgw analytics {args.job}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before the queries started
        print(f"[{args.job}] interrupted", file=sys.stderr)
        return 130
    finally:
        if spark is not None:
            spark.stop()
        work = getattr(args, "work_dir", None)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def run_local(args: argparse.Namespace) -> int:
    """``func`` of ``mqgw analytics <job>``: local session with the project's jars."""
    return _run(args, local=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point under spark-submit / ``python -m analytics``."""
    parser = argparse.ArgumentParser(prog="python -m", description="mq-stream-gateway "
                                     "analytics jobs (docs/analytics.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    # Under spark-submit there is no "analytics" word: accept "<job> ..." directly.
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in JOB_NAMES:
        argv = ["analytics", *argv]
    args = parser.parse_args(argv)
    return _run(args, local=False)
