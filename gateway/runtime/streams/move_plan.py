"""The plan of ``mqgw streams move STREAM --to QM``: its durable journal and, from it,
the next step. Pure (no I/O): :mod:`gateway.runtime.streams.move` carries the steps out.

Why a journal of completed steps: a move may be stopped at any point (SIGKILL of the
command or of a node) and must continue where it stopped when run again. Every step is
idempotent, so a step that ran but was not recorded runs again harmlessly; the journal
only says which steps are certainly done, and the plan is a fixed sequence of steps
decided when the move starts:

1. ``hold:<QM>`` for every node: the stream's publishing route (``QALIAS(route)``) is
   pointed at a local holding queue, so new publications wait there (MQ keeps them;
   nothing is refused).
2. ``drain``: wait until nothing routed before the hold is anywhere but delivered: no
   transmission queue of any node holds a message for the stream's queue, every node's
   stream queue is empty (committed), in causal order (see ``move.drained``).
2b. ``retained`` (journals of version 2): the old owner's retained publications are put
   on the new owner's stream queue as the old owner's forwards
   (:mod:`gateway.runtime.streams.move_retained`), ahead of the held publications.
2c. ``sinks`` (journals of version 3): once the new owner has taken the copies and the
   old nodes' sink backlogs hold nothing of the stream, the sink subscriptions recorded
   in ``sinks`` are made on the new owner (NewPubsOnly) and removed where they were,
   with the broker's own RegSub/DeregSub naming each sink's backlog queue
   (:mod:`gateway.runtime.streams.move_sinks`).
3. ``release:<QM>``, the new owner first: the held publications go to the new owner's
   stream queue (in their order), then the route is pointed there.
4. ``finish``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gateway.runtime.streams.route_state import (
    HOLD,
    MAX_NAME,
    RouteState,
    fit_queue_name,
    hold_queue_name,
    route_state,
)

__all__ = [
    "HOLD",
    "JOURNAL_VERSION",
    "MoveJournal",
    "MovedSink",
    "RouteState",
    "hold_queue_name",
    "journal_path",
    "next_step",
    "plan_steps",
    "read_journal",
    "record_done",
    "release_target",
    "remote_def_name",
    "reply_queue_name",
    "route_state",
    "sinks_off_owner",
    "write_journal",
]

JOURNAL_VERSION = 3
#: Prefix of the queue the brokers answer a move's sink commands on.
REPLY = "MQGW.MOVE.REPLY."


class MovedSink(BaseModel):
    """One sink subscription to the stream that the move takes from ``q_mgr`` to the
    new owner (decided when the move starts: the stores change during it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_mgr: str
    sink: str
    #: the pattern within the stream, as the store keeps it
    topic: str
    #: 1 MQRFH character patterns, 2 topic patterns (gateway.pubsub.topics.Scheme)
    scheme: int


class MoveJournal(BaseModel):
    """A move in progress or done (JSON boundary, ``move-<stream>.json``)."""

    model_config = ConfigDict(extra="forbid")

    version: int = JOURNAL_VERSION
    stream: str
    #: the QALIAS publishers put to, on every node
    route: str
    from_q_mgr: str
    to_q_mgr: str
    #: every node's queue manager, in the order given (the configuration file of each)
    nodes: dict[str, str]
    #: steps certainly done, in order
    done: list[str] = []
    started: str = ""
    updated: str = ""
    #: the last reason the move stopped unfinished (for ``--status``)
    waiting: str = ""
    #: the sink subscriptions step ``sinks`` moves to the new owner (version 3)
    sinks: list[MovedSink] = []

    @property
    def hold_queue(self) -> str:
        return hold_queue_name(self.stream)

    @property
    def complete(self) -> bool:
        return next_step(self) is None


def reply_queue_name(stream: str) -> str:
    """The local queue the broker answers a move's sink commands on (deleted after)."""
    return fit_queue_name(stream, REPLY)


def remote_def_name(route: str, q_mgr: str) -> str:
    """The QREMOTE a non-owner's route aliases to: ``<route>.<owner QM>``."""
    name = f"{route}.{q_mgr}"
    return name if len(name) <= MAX_NAME else fit_queue_name(name, "MQGW.ROUTE.")


def plan_steps(journal: MoveJournal) -> list[str]:
    """Every step of the move, in order."""
    others = [n for n in journal.nodes if n != journal.to_q_mgr]
    # a move started by version 1 (no retained copy) continues as it was planned
    copy = ["retained"] if journal.version >= 2 else []
    # and one started by version 2 (sinks never moved) as well
    sinks = ["sinks"] if journal.version >= 3 else []
    return (
        [f"hold:{n}" for n in journal.nodes]
        + ["drain"]
        + copy
        + sinks
        + [f"release:{journal.to_q_mgr}"]
        + [f"release:{n}" for n in others]
        + ["finish"]
    )


def next_step(journal: MoveJournal) -> str | None:
    """The first step not certainly done (None: the move is complete)."""
    done = set(journal.done)
    for step in plan_steps(journal):
        if step not in done:
            return step
    return None


def record_done(journal: MoveJournal, step: str, now: datetime | None = None) -> MoveJournal:
    """The journal with ``step`` recorded as done; only the next step may be recorded
    (ValueError otherwise: a step out of order would skip a barrier)."""
    expected = next_step(journal)
    if step != expected:
        raise ValueError(f"step {step!r} recorded out of order (next is {expected!r})")
    stamp = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    return journal.model_copy(update={"done": [*journal.done, step], "updated": stamp,
                                      "waiting": ""})


def release_target(journal: MoveJournal, q_mgr: str) -> str:
    """What the route on ``q_mgr`` names once released: the stream queue itself on the
    new owner, elsewhere the remote definition of it at the new owner."""
    if q_mgr == journal.to_q_mgr:
        return journal.stream
    return remote_def_name(journal.route, journal.to_q_mgr)


def sinks_off_owner(
    sinks: Mapping[str, Iterable[str]], to_q_mgr: str
) -> dict[str, list[str]]:
    """node -> the sink instances subscribed to the stream there, for every node but
    the new owner (``sinks``: each node's sink subscriptions on the stream): those the
    move takes to the new owner, or, with ``--leave-sinks``, leaves behind."""
    return {n: sorted(set(v)) for n, v in sorted(sinks.items()) if n != to_q_mgr and v}


# ------------------------------------------------------------------ the file -------


def journal_path(directory: Path, stream: str) -> Path:
    """Where the journal of a move of ``stream`` lives in ``directory``."""
    return directory / f"move-{stream}.json"


def read_journal(path: Path) -> MoveJournal | None:
    """The journal at ``path``; None when there is none. ValueError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return MoveJournal.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{path} is not a move journal: {exc}") from None


def write_journal(path: Path, journal: MoveJournal) -> None:
    """Write atomically and durably (a crash leaves the old journal or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(journal.model_dump_json(indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
