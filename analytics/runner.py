"""Start a job's streaming queries, report progress, stop cleanly.

``--once`` uses ``trigger(availableNow=True)``: every query drains what the topics hold
now (in as many micro-batches as ``maxOffsetsPerTrigger`` allows) and stops. Otherwise
queries run on a processing-time trigger until Ctrl-C or SIGTERM, which stop them
between batches so output tables and checkpoint stay consistent.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from analytics import AnalyticsError
from analytics.job import BatchWriter, JobOptions, QueryPlan


class QueryFailedError(AnalyticsError):
    """A streaming query stopped with an exception; ``query`` names it."""

    def __init__(self, message: str, *, job: str, query: str) -> None:
        super().__init__(message, job=job)
        self.query = query


@dataclass(slots=True)
class QueryStats:
    """What a query has done so far, from its progress reports."""

    batches: int = 0
    rows: int = 0
    lag: int | None = None
    last_batch: int = -1


@dataclass(slots=True)
class RunResult:
    """Outcome of :func:`run_job`: per-query stats and whether Ctrl-C stopped it."""

    stats: dict[str, QueryStats] = field(default_factory=dict)
    interrupted: bool = False


def offsets_lag(progress_source: dict[str, Any]) -> int | None:
    """Records between what a batch read up to and the latest offsets (Kafka source)."""
    def parse(raw: object) -> dict[str, dict[str, int]] | None:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                return None
        return raw if isinstance(raw, dict) else None

    end = parse(progress_source.get("endOffset"))
    latest = parse(progress_source.get("latestOffset"))
    if end is None or latest is None:
        return None
    lag = 0
    for topic, parts in latest.items():
        for part, offset in parts.items():
            done = end.get(topic, {}).get(part, 0)
            lag += max(int(offset) - int(done), 0)
    return lag


def _persisting(write: BatchWriter) -> BatchWriter:
    """Cache each micro-batch while it is written: writers read it more than once."""
    def run(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            write(batch, batch_id)
        finally:
            batch.unpersist()
    return run


def start_queries(plans: list[QueryPlan], checkpoint: str, *, once: bool,
                  trigger: str) -> list[StreamingQuery]:
    """Start each plan's query with checkpoint ``<checkpoint>/<plan name>``."""
    started: list[StreamingQuery] = []
    try:
        for plan in plans:
            writer = (
                plan.frame.writeStream.queryName(plan.name)
                .outputMode(plan.output_mode)
                .option("checkpointLocation", f"{checkpoint.rstrip('/')}/{plan.name}")
                .foreachBatch(_persisting(plan.write_batch))
            )
            writer = writer.trigger(availableNow=True) if once else writer.trigger(
                processingTime=trigger)
            started.append(writer.start())
    except BaseException:
        for q in started:
            q.stop()
        raise
    return started


class StopSignals:
    """Turn Ctrl-C (SIGINT) and SIGTERM into a request checked between polls.

    pyspark's own SIGINT handler cancels every Spark job and raises inside whatever py4j
    call is running, which can abort a table merge half-way. Here a signal only sets a
    flag; the runner then stops each query once its current micro-batch has finished.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested.set()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stop_between_batches(query: StreamingQuery, wait_seconds: float = 120.0) -> None:
    """Stop ``query`` when no micro-batch is running (bounded wait), so no output table
    is left half-merged; the checkpoint then resumes after the last completed batch."""
    deadline = time.monotonic() + wait_seconds
    while query.isActive and time.monotonic() < deadline:
        status = query.status
        if not status.get("isTriggerActive", False):
            break
        time.sleep(0.2)
    query.stop()


def _report(job: str, queries: list[StreamingQuery], result: RunResult, out: TextIO) -> None:
    for q in queries:
        name = q.name or q.id
        stats = result.stats.setdefault(str(name), QueryStats())
        for progress in q.recentProgress:
            batch = int(progress.get("batchId", -1))
            if batch <= stats.last_batch:
                continue
            stats.last_batch = batch
            rows = int(progress.get("numInputRows", 0))
            stats.batches += 1
            stats.rows += rows
            lags = [offsets_lag(s) for s in progress.get("sources", [])]
            known = [x for x in lags if x is not None]
            stats.lag = sum(known) if known else None
            rate = progress.get("processedRowsPerSecond") or 0.0
            lag_text = "?" if stats.lag is None else str(stats.lag)
            print(f"[{job}] {name}: batch {batch}: {rows} rows ({stats.rows} total, "
                  f"{float(rate):.0f} rows/s), lag {lag_text}", file=out, flush=True)


def run_job(spark: SparkSession, job: str, build: Callable[[SparkSession, JobOptions],
            list[QueryPlan]], options: JobOptions, *, checkpoint: str, once: bool,
            trigger: str = "10 seconds", poll_seconds: float = 1.0,
            out: TextIO | None = None) -> RunResult:
    """Run ``job`` until its queries finish (``once``) or Ctrl-C; raise if one fails.

    Progress lines go to ``out`` (``sys.stdout`` at call time by default).
    """
    out = sys.stdout if out is None else out
    result = RunResult()
    with StopSignals() as stop:
        queries = start_queries(build(spark, options), checkpoint, once=once, trigger=trigger)
        while any(q.isActive for q in queries) and not stop.requested.is_set():
            _report(job, queries, result, out)
            for q in queries:
                if q.isActive:
                    # a failure surfaces below through q.exception()
                    with contextlib.suppress(Exception):
                        q.awaitTermination(max(int(poll_seconds), 1))
                    break
        if stop.requested.is_set():
            result.interrupted = True
            print(f"[{job}] stopping after the current batch ...", file=out, flush=True)
            for q in queries:
                stop_between_batches(q)
    _report(job, queries, result, out)
    for q in queries:
        error = q.exception()
        if error is not None:
            raise QueryFailedError(f"query {q.name} failed: {error}", job=job,
                                   query=str(q.name))
    return result
