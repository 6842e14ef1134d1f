"""The stream report gathered from a queue manager, and its facts as /metrics families.

One home for "look at the queue manager and judge": ``mqgw streams check`` and the
running gateway (its housekeeping task, every sample) both call :func:`collect_report`;
``/healthz`` carries ``report.to_json()`` under ``streams`` and ``/metrics`` the families
of :func:`stream_metric_families`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from gateway.mq.port import Connection
from gateway.pubsub.streams import ADMIN_STREAM
from gateway.runtime.neighbours.announced import stored_streams
from gateway.runtime.neighbours.attach import runs_neighbour_links
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.state import (
    NeighbourState,
    NeighbourStateError,
    neighbours_db_of,
)
from gateway.runtime.streams.check import StreamReport, build_report
from gateway.runtime.streams.migration import migration_path, read_migration
from gateway.runtime.streams.observe import (
    BROWSE_LIMIT,
    browse_dead_lettered,
    dead_letter_queue,
    observe_queue,
    observe_streams,
)
from gateway.runtime.streams.union import neighbour_streams, serviced_streams

__all__ = [
    "DeadLetterCache",
    "collect_report",
    "remembered_neighbours",
    "serviced_now",
    "stream_metric_families",
    "wanted_streams",
]

log = logging.getLogger(__name__)


def remembered_neighbours(
    state: NeighbourState, configured: Sequence[NeighbourConfig] = ()
) -> dict[str, frozenset[str]]:
    """The common streams of each neighbour in ``state`` that is neither refused nor
    being cleared: a neighbour joined with the CLI, or whose streams were learnt at
    join, is in no configuration file. What was learnt is screened as the links screen
    an announcement, with the ``accept_streams`` and ``max_streams`` of the
    ``configured`` neighbour (a file an older gateway wrote may hold any name)."""
    by_q_mgr = {c.q_mgr: c for c in configured}
    out: dict[str, frozenset[str]] = {}
    for row in state.neighbours():
        if row.state == "refused" or row.clear_requested:
            continue
        if row.learnt_streams is not None:
            cfg = by_q_mgr.get(row.q_mgr)
            kept = (
                stored_streams(row.learnt_streams)
                if cfg is None
                else stored_streams(
                    row.learnt_streams, accept=cfg.accept_streams, max_streams=cfg.max_streams
                )
            )
            row = dataclasses.replace(row, learnt_streams=kept)
        out[row.q_mgr] = row.common_streams
    return out


def _remembered_on_disk(loaded: Any) -> dict[str, frozenset[str]]:
    """:func:`remembered_neighbours` of the ``neighbours.db`` next to the pub/sub store
    (``mqgw streams check`` with the gateway stopped)."""
    path = neighbours_db_of(loaded.path(loaded.gateway.broker.store))
    if not path.is_file():
        return {}
    try:
        state = NeighbourState(path)
    except NeighbourStateError as exc:
        log.warning("stream union without the remembered neighbours: %s", exc)
        return {}
    try:
        return remembered_neighbours(state, getattr(loaded.gateway, "neighbours", None) or ())
    except NeighbourStateError as exc:
        log.warning("stream union without the remembered neighbours: %s", exc)
        return {}
    finally:
        state.close()


def wanted_streams(
    loaded: Any, remembered: Mapping[str, Iterable[str]] | None = None
) -> tuple[dict[str, tuple[str, ...]], str | None, frozenset[str]]:
    """(stream → who needs it, migrated-from queue manager, migrated streams);
    ``remembered``: the running links' :func:`remembered_neighbours` (None: read
    ``neighbours.db``)."""
    who: dict[str, list[str]] = {s: ["gateway"] for s in serviced_streams(loaded)}
    if remembered is None:
        remembered = _remembered_on_disk(loaded)
    for q_mgr, streams in sorted(neighbour_streams(loaded, remembered).items()):
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


def serviced_now(loaded: Any) -> set[str]:
    """The streams the gateway services: :func:`serviced_streams`, and the admin stream
    where the neighbour links run (the broker services it for them: probes and
    StreamSupport publications arrive there)."""
    out = serviced_streams(loaded)
    if runs_neighbour_links(loaded.gateway, loaded.path(loaded.gateway.broker.store)):
        out.add(ADMIN_STREAM)
    return out


@dataclass(slots=True)
class DeadLetterCache:
    """The running gateway's DLQ scan: redone only when the DLQ's depth changed, and only
    while the DLQ is at most ``max_depth`` deep (browsing the embedded queue manager
    costs more than linearly with the depth, and the scan runs in the gateway's event
    loop); a deeper DLQ keeps the last counts and the report says so."""

    max_depth: int = 1000
    depth: int = -1
    streams: frozenset[str] = frozenset()
    counts: dict[str, int] = field(default_factory=dict)

    async def counts_for(self, conn: Connection, dlq: str, streams: list[str]) -> str:
        """Refresh ``counts`` if needed; a note when they could not be refreshed."""
        state = await observe_queue(conn, dlq, 0)
        wanted = frozenset(streams)
        if state.depth == self.depth and wanted == self.streams:
            return ""
        if state.depth > self.max_depth:
            return (
                f"{dlq} holds {state.depth} messages, more than the running gateway scans "
                f"({self.max_depth}): counts from the last scan; `mqgw streams check` with "
                "the gateway stopped counts them all"
            )
        found = await browse_dead_lettered(conn, dlq, streams)
        self.counts = dict(Counter(d.stream for d in found))
        self.depth, self.streams = state.depth, wanted
        return ""


async def collect_report(
    conn: Connection,
    loaded: Any,
    *,
    browse_limit: int = BROWSE_LIMIT,
    dead_letters: DeadLetterCache | None = None,
    remembered: Mapping[str, Iterable[str]] | None = None,
) -> StreamReport:
    """Look at every stream of the union on ``conn``'s queue manager and judge
    (``browse_limit``: messages browsed per stream queue for the oldest one; the running
    gateway browses only the first, which is the oldest unless priorities differ, and
    keeps its DLQ counts in ``dead_letters`` and gives its links' ``remembered``
    neighbours)."""
    wanted, origin, migrated = wanted_streams(loaded, remembered)
    dlq = await dead_letter_queue(conn, loaded.gateway.broker.dead_letter_queue)
    note = ""
    if dead_letters is None:
        queues, dead = await observe_streams(conn, list(wanted), dlq, browse_limit)
    else:
        queues = {s: await observe_queue(conn, s, browse_limit) for s in wanted}
        note = await dead_letters.counts_for(conn, dlq, list(wanted))
        dead = dead_letters.counts
    return build_report(
        wanted,
        serviced_now(loaded),
        queues,
        dead,
        now=time.time(),
        dead_letter_queue=dlq,
        migrated_from=origin,
        migrated=migrated,
        dead_letter_note=note,
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
