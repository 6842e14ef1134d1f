"""The stream report gathered from a queue manager, and its facts as /metrics families.

One home for "look at the queue manager and judge": ``mqgw streams check`` and the
running gateway (its housekeeping task, every sample) both call :func:`collect_report`;
``/healthz`` carries ``report.to_json()`` under ``streams`` and ``/metrics`` the families
of :func:`stream_metric_families`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from gateway.mq.port import Connection
from gateway.runtime.streams.check import StreamReport, build_report
from gateway.runtime.streams.migration import migration_path, read_migration
from gateway.runtime.streams.observe import BROWSE_LIMIT, dead_letter_queue, observe_streams
from gateway.runtime.streams.union import neighbour_streams, serviced_streams

__all__ = ["collect_report", "stream_metric_families", "wanted_streams"]


def wanted_streams(loaded: Any) -> tuple[dict[str, tuple[str, ...]], str | None, frozenset[str]]:
    """(stream → who needs it, migrated-from queue manager, migrated streams)."""
    who: dict[str, list[str]] = {s: ["gateway"] for s in serviced_streams(loaded)}
    for q_mgr, streams in sorted(neighbour_streams(loaded).items()):
        for s in streams:
            who.setdefault(s, []).append(f"neighbour {q_mgr}")
    try:
        record = read_migration(migration_path(loaded.path(loaded.gateway.broker.store)))
    except ValueError:
        record = None  # load_config has refused it already
    migrated: frozenset[str] = frozenset()
    origin = None
    if record is not None:
        migrated = frozenset(record.streams)
        origin = record.from_q_mgr or "(stream list)"
        for s in migrated:
            who.setdefault(s, []).append(f"migration {origin}")
    return {s: tuple(w) for s, w in who.items()}, origin, migrated


async def collect_report(
    conn: Connection, loaded: Any, *, browse_limit: int = BROWSE_LIMIT
) -> StreamReport:
    """Look at every stream of the union on ``conn``'s queue manager and judge
    (``browse_limit``: messages browsed per stream queue for the oldest one; the running
    gateway browses only the first, which is the oldest unless priorities differ)."""
    wanted, origin, migrated = wanted_streams(loaded)
    dlq = await dead_letter_queue(conn, loaded.gateway.broker.dead_letter_queue)
    queues, dead = await observe_streams(conn, list(wanted), dlq, browse_limit)
    return build_report(
        wanted,
        serviced_streams(loaded),
        queues,
        dead,
        now=time.time(),
        dead_letter_queue=dlq,
        migrated_from=origin,
        migrated=migrated,
    )


def stream_metric_families(report: StreamReport | None) -> Iterator[GaugeMetricFamily]:
    """``mqgw_stream_queue_missing``, ``mqgw_stream_unserviced_depth``,
    ``mqgw_stream_dead_lettered`` (label ``stream``) and ``mqgw_migration_incomplete``."""
    missing = GaugeMetricFamily(
        "mqgw_stream_queue_missing",
        "1 when a stream the gateway must support has no queue (a neighbour's "
        "publications go to the dead-letter queue)",
        labels=["stream"],
    )
    unserviced = GaugeMetricFamily(
        "mqgw_stream_unserviced_depth",
        "Messages on a stream queue nothing services (0 when serviced)",
        labels=["stream"],
    )
    dead = GaugeMetricFamily(
        "mqgw_stream_dead_lettered",
        "Dead-letter messages with reason 2085 whose destination is this stream queue",
        labels=["stream"],
    )
    incomplete = GaugeMetricFamily(
        "mqgw_migration_incomplete", "1 while a migrated stream is not serviced"
    )
    if report is not None:
        for f in report.streams:
            missing.add_metric([f.stream], 0.0 if f.queue_exists else 1.0)
            unserviced.add_metric([f.stream], float(f.unserviced_depth))
            dead.add_metric([f.stream], float(f.dead_lettered))
        incomplete.add_metric([], 1.0 if report.migration_pending else 0.0)
    yield from (missing, unserviced, dead, incomplete)
