"""The report of ``mqgw streams check`` (pure): the stream union against what the queue
manager holds and what the broker services, with every problem named.

Why pure: the same facts feed the command's table and JSON, ``/healthz`` and
``/metrics``; only :mod:`gateway.runtime.streams.observe` talks to the queue manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

__all__ = [
    "QueueState", "StreamCheckJson", "StreamFacts", "StreamFactsJson", "StreamReport",
    "StreamReportJson", "build_report",
]

_DOCUMENTED = ConfigDict(use_attribute_docstrings=True)


@with_config(_DOCUMENTED)
class StreamFactsJson(TypedDict):
    """One stream of the union."""

    stream: str
    """The stream (its queue's name)."""
    wanted_by: list[str]
    """Who needs it: ``gateway`` (it services it), ``neighbour <QM>``, ``migration <QM>``."""
    queue_exists: bool
    """The stream queue is defined."""
    serviced: bool
    """The broker services the queue."""
    depth: int
    """Messages on the queue."""
    oldest_age_s: float | None
    """Age of the oldest message on the queue in seconds; null when it is empty."""
    dead_lettered: int
    """Messages on the dead-letter queue with MQDLH reason 2085 whose destination is
    this stream queue."""
    problems: list[str]
    """What is wrong with the stream; empty when all is well."""


#: The recorded migration of a legacy broker (``mqgw migrate``); the functional form
#: because ``from`` is a Python keyword.
MigrationJson = TypedDict("MigrationJson", {
    "from": Annotated[str, Field(description="The legacy broker's queue manager.")],
    "complete": Annotated[bool, Field(description="Every migrated stream is serviced.")],
    "pending": Annotated[list[str], Field(
        description="The migrated streams not serviced yet (the migration is incomplete "
        "while any is).")],
})


class StreamReportJson(TypedDict):
    """The stream union against the stream queues and what the broker services (the
    ``streams`` report of ``/healthz`` too). Descriptions as ``Field`` (not attribute
    docstrings) so that :class:`StreamCheckJson` inherits them."""

    ok: Annotated[bool, Field(description="No problem anywhere.")]
    dead_letter_queue: Annotated[str, Field(
        description="The dead-letter queue the counts were taken from.")]
    dead_letter_note: Annotated[str, Field(
        description="Why the dead-letter counts may be stale; empty when just counted.")]
    migration: Annotated[MigrationJson | None, Field(
        description="The recorded migration; null when none is recorded.")]
    streams: Annotated[list[StreamFactsJson], Field(description="Every stream of the union.")]
    problems: Annotated[list[str], Field(
        description="Every problem, as ``<stream>: <problem>`` (and the incomplete "
        "migration).")]


@with_config(_DOCUMENTED)
class StreamCheckJson(StreamReportJson):
    """The stream check's report (``mqgw streams check --json``) and what its options
    did."""

    actions: list[str]
    """What ``--fix``, ``--write-config`` and ``--replay-dlq`` did or advise, one
    sentence each; empty without them."""


@dataclass(frozen=True, slots=True)
class QueueState:
    """What the queue manager says about one stream queue."""

    exists: bool
    depth: int = 0
    #: PutDate/PutTime of the oldest message browsed, seconds since the epoch
    oldest_put: float | None = None


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """One stream of the union: provisioning, backlog and dead-lettered publications."""

    stream: str
    #: who needs it: "gateway", "neighbour <QM>", "migration <QM>"
    wanted_by: tuple[str, ...]
    queue_exists: bool
    serviced: bool
    depth: int
    oldest_age_s: float | None
    #: messages on the DLQ with MQDLH reason 2085 whose DestQName is this stream
    dead_lettered: int
    problems: tuple[str, ...]

    @property
    def unserviced_depth(self) -> int:
        """Messages piling up on a queue nothing services (0 when serviced)."""
        return 0 if self.serviced else self.depth


@dataclass(frozen=True, slots=True)
class StreamReport:
    streams: tuple[StreamFacts, ...]
    dead_letter_queue: str
    #: the migrated legacy broker's queue manager, when a migration is recorded
    migrated_from: str | None = None
    #: migrated streams not serviced yet (the migration is incomplete while any is)
    migration_pending: tuple[str, ...] = ()
    #: why the dead-letter counts may be stale ("" when just counted)
    dead_letter_note: str = ""

    @property
    def problems(self) -> list[str]:
        out = [f"{f.stream}: {p}" for f in self.streams for p in f.problems]
        if self.migration_pending:
            out.append(
                f"migration incomplete (from {self.migrated_from}): not serviced yet: "
                + ", ".join(self.migration_pending)
            )
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> StreamReportJson:
        migration: MigrationJson | None = None
        if self.migrated_from is not None:
            migration = {
                "from": self.migrated_from,
                "complete": not self.migration_pending,
                "pending": list(self.migration_pending),
            }
        return {
            "ok": self.ok,
            "dead_letter_queue": self.dead_letter_queue,
            "dead_letter_note": self.dead_letter_note,
            "migration": migration,
            "streams": [
                {
                    "stream": f.stream,
                    "wanted_by": list(f.wanted_by),
                    "queue_exists": f.queue_exists,
                    "serviced": f.serviced,
                    "depth": f.depth,
                    "oldest_age_s": f.oldest_age_s,
                    "dead_lettered": f.dead_lettered,
                    "problems": list(f.problems),
                }
                for f in self.streams
            ],
            "problems": self.problems,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamReport:
        """Inverse of :meth:`to_json` (the report a running gateway's /healthz carries);
        KeyError/TypeError/ValueError on anything else."""
        migration = data.get("migration") or {}
        return cls(
            tuple(
                StreamFacts(
                    str(f["stream"]),
                    tuple(f["wanted_by"]),
                    bool(f["queue_exists"]),
                    bool(f["serviced"]),
                    int(f["depth"]),
                    None if f["oldest_age_s"] is None else float(f["oldest_age_s"]),
                    int(f["dead_lettered"]),
                    tuple(f["problems"]),
                )
                for f in data["streams"]
            ),
            str(data["dead_letter_queue"]),
            migration.get("from"),
            tuple(migration.get("pending", ())),
            str(data.get("dead_letter_note", "")),
        )

    def text(self) -> str:
        head = f"{'STREAM':36} {'QUEUE':7} {'SERVICED':8} {'DEPTH':>7} {'OLDEST':>9} {'DLQ':>5}"
        lines = [head]
        for f in self.streams:
            age = "-" if f.oldest_age_s is None else f"{f.oldest_age_s:.0f}s"
            lines.append(
                f"{f.stream:36} {'yes' if f.queue_exists else 'MISSING':7} "
                f"{'yes' if f.serviced else 'NO':8} {f.depth:>7} {age:>9} {f.dead_lettered:>5}"
            )
        if self.migrated_from is not None:
            state = "incomplete" if self.migration_pending else "complete"
            lines.append(f"migration from {self.migrated_from}: {state}")
        if self.dead_letter_note:
            lines.append(self.dead_letter_note)
        problems = self.problems
        lines.append("all well" if not problems else f"{len(problems)} problem(s):")
        lines += [f"  {p}" for p in problems]
        return "\n".join(lines)


def build_report(
    wanted: Mapping[str, tuple[str, ...]],
    serviced: set[str],
    queues: Mapping[str, QueueState],
    dead_lettered: Mapping[str, int],
    *,
    now: float,
    dead_letter_queue: str,
    migrated_from: str | None = None,
    migrated: frozenset[str] = frozenset(),
    dead_letter_note: str = "",
) -> StreamReport:
    """The report for the streams in ``wanted`` (stream → who needs it)."""
    facts: list[StreamFacts] = []
    for stream in sorted(wanted):
        state = queues.get(stream, QueueState(False))
        dlq = dead_lettered.get(stream, 0)
        problems: list[str] = []
        if not state.exists:
            problems.append(
                f"stream queue {stream} is missing: a neighbour's publications go to the "
                f"dead-letter queue"
            )
        if stream not in serviced:
            problems.append(
                f"stream queue {stream} is not serviced: add it to broker.streams"
                + (f" ({state.depth} message(s) waiting)" if state.depth else "")
            )
        if dlq:
            problems.append(
                f"{dlq} publication(s) for {stream} on {dead_letter_queue} (reason 2085): "
                "`mqgw streams check --fix --replay-dlq` puts them back"
            )
        age = None if state.oldest_put is None else max(0.0, now - state.oldest_put)
        facts.append(
            StreamFacts(
                stream,
                wanted[stream],
                state.exists,
                stream in serviced,
                state.depth,
                age,
                dlq,
                tuple(problems),
            )
        )
    pending = tuple(sorted(s for s in migrated if s not in serviced))
    return StreamReport(tuple(facts), dead_letter_queue, migrated_from, pending, dead_letter_note)
