"""Carrying out ``mqgw streams move`` (the plan: :mod:`gateway.runtime.streams.move_plan`).

Every step changes the nodes only with MQ's own administration (MQSC through each
running queue manager's local socket) and MQ messages moved under syncpoint, and is
idempotent: run again after a crash, it ends in the same state without moving a message
twice. The journal records a step after it completed; :func:`run_move` runs the steps
still to do and stops early (returning why) when a node is not reachable or the drain
does not finish within its bound: run the move again to continue.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gateway.mq.port import Browse, Connection, GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.runtime.backlog_format import (
    BacklogFormatError,
    backlog_queue_name,
    decode_backlog_message,
)
from gateway.runtime.backlog_seal import KEY_FILE, KEY_SIZE
from gateway.runtime.sink_command_seal import seal_command
from gateway.runtime.streams.move_plan import (
    MovedSink,
    MoveJournal,
    RouteState,
    next_step,
    record_done,
    release_target,
    reply_queue_name,
    route_state,
)
from gateway.runtime.streams.move_sinks import command_outcome, refused, sink_command
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_XMIT_Q_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason, reason_text
from gateway.wire.xqh import unwrap_from_xmitq

__all__ = [
    "MoveError",
    "MoveNode",
    "RetainedCopies",
    "SocketNode",
    "close_nodes",
    "connect_nodes",
    "deep_backlogs",
    "drained",
    "move_sinks",
    "parse_display",
    "read_route",
    "run_move",
    "run_step",
]

#: Messages moved from the holding queue per unit of work.
BATCH = 100


class MoveError(Exception):
    """A step cannot go on now (a node unreachable, an MQSC command refused)."""


class MoveNode(Protocol):
    """What a move needs of one node's queue manager."""

    @property
    def q_mgr(self) -> str: ...

    async def mqsc(self, script: str) -> None:
        """Run MQSC; MoveError naming the failed command when one fails."""

    async def queues(self) -> dict[str, dict[str, str]]:
        """Every queue's DISPLAY attributes (``TYPE``, ``TARGET``, ``CURDEPTH``, ...)."""

    async def in_transmission(self, q_name: str) -> int:
        """Messages on any transmission queue whose header names queue ``q_name``."""

    async def move_batch(self, source: str, target: str, limit: int) -> int:
        """Move up to ``limit`` messages from ``source`` to ``target`` in one unit of
        work (context kept); how many moved (0: ``source`` is empty)."""

    async def put_all(self, target: str, messages: list[tuple[MQMD, bytes]]) -> None:
        """Put ``messages`` on ``target`` in order, context as given, in units of work
        of :data:`BATCH`."""

    async def backlog_holds(self, sink: str, stream: str) -> int:
        """Deliveries of ``stream`` on sink ``sink``'s backlog queue, those its
        forwarder has got but not committed included."""

    async def sink_command(self, sub: MovedSink, stream: str, *, register: bool) -> None:
        """Make (RegSub, NewPubsOnly) or remove (DeregSub) ``sub``'s sink subscription
        through this node's broker; MoveError when refused or unanswered."""

    async def forget_replies(self, stream: str) -> None:
        """Delete the reply queue :meth:`sink_command` used, if any."""


#: The old owner's retained publications as forwards to the new owner (MQMD, body).
RetainedCopies = Callable[[], list[tuple[MQMD, bytes]]]


# ---------------------------------------------------------------- the steps --------


async def read_route(node: MoveNode, stream: str, route: str) -> RouteState:
    """Whom ``node``'s route of ``stream`` names."""
    qs = await node.queues()
    alias = qs.get(route)
    target = alias.get("TARGET") if alias and alias.get("TYPE") == "QALIAS" else None
    remote = None
    if target is not None:
        t = qs.get(target)
        if t is not None and t.get("TYPE") == "QREMOTE":
            remote = (t.get("RNAME", ""), t.get("RQMNAME", ""))
    return route_state(node.q_mgr, stream, route, target, remote)


async def hold(node: MoveNode, journal: MoveJournal) -> None:
    """New publications routed on ``node`` wait in its holding queue, which may hold as
    many as the stream queue (its MAXDEPTH)."""
    qs = await node.queues()
    hq = journal.hold_queue
    depth = qs.get(journal.stream, {}).get("MAXDEPTH", "")
    maxdepth = f" MAXDEPTH({depth})" if depth.isdigit() else ""
    script = []
    if hq not in qs:  # never REPLACE: it may hold publications of an interrupted run
        script.append(
            f"DEFINE QLOCAL({hq}) DEFPSIST(YES){maxdepth} DESCR('held by mqgw streams "
            f"move {journal.stream}')"
        )
    script.append(f"ALTER QLOCAL({hq}) PUT(ENABLED) GET(ENABLED){maxdepth}")
    script.append(f"ALTER QALIAS({journal.route}) TARGET({hq})")
    await node.mqsc("\n".join(script))


async def drained(nodes: Mapping[str, MoveNode], journal: MoveJournal) -> str | None:
    """None when everything routed before the hold has been taken by its broker and
    forwarded; else what still waits. Looked at in the order a publication travels
    (other nodes' transmission queues, the old owner's stream queue, its transmission
    queues, then every stream queue and every transmission queue, once per node), so a
    message moving on between two looks is seen at a later one."""
    stream, old = journal.stream, journal.from_q_mgr
    order = [n for n in nodes if n != old]
    for name in order:
        if n := await nodes[name].in_transmission(stream):
            return f"{n} message(s) for {stream} on {name}'s transmission queues"
    depth = await _depth(nodes[old], stream)
    if depth:
        return f"{depth} publication(s) on {old}'s {stream}"
    if n := await nodes[old].in_transmission(stream):
        return f"{n} message(s) for {stream} on {old}'s transmission queues"
    # Forwarded publications may cross several nodes (a hierarchy): one round per hop.
    for _ in range(len(nodes)):
        for name, node in nodes.items():
            if depth := await _depth(node, stream):
                return f"{depth} publication(s) on {name}'s {stream}"
        for name, node in nodes.items():
            if n := await node.in_transmission(stream):
                return f"{n} message(s) for {stream} on {name}'s transmission queues"
    return None


async def _depth(node: MoveNode, q_name: str) -> int:
    q = (await node.queues()).get(q_name)
    if q is None:
        raise MoveError(f"{node.q_mgr} has no queue {q_name}")
    return int(q.get("CURDEPTH", "0") or 0)


async def release(
    node: MoveNode, journal: MoveJournal, *, timeout: float = 60.0, poll: float = 0.2
) -> None:
    """The held publications go to the new owner in their order, then the route.

    Most of them move while the route still holds (nothing refused); then the holding
    queue is put-inhibited for the moment the last ones move and the route changes, so
    no publication put meanwhile can overtake a held one (publishers see MQRC 2051
    PUT_INHIBITED meanwhile and put again). The route changes only once the holding
    queue's depth is 0: a put that passed the put check just before the inhibit is
    visible only once its message is on disk, and a killed move's batch only once
    backed out; CURDEPTH counts both, and a route changed before them would leave them
    behind, to be released after the publisher's later ones."""
    target = release_target(journal, node.q_mgr)
    hq = journal.hold_queue
    if target != journal.stream:
        await node.mqsc(
            f"DEFINE QREMOTE({target}) RNAME({journal.stream}) RQMNAME({journal.to_q_mgr}) "
            f"DEFPSIST(YES) REPLACE"
        )
    qs = await node.queues()
    if hq in qs:
        # What is held now moves first; publishers keep adding meanwhile, so this part
        # is bounded by the depth at its start (else a fast publisher could keep it going)
        left = int(qs[hq].get("CURDEPTH", "0") or 0)
        while left > 0 and (moved := await node.move_batch(hq, target, min(BATCH, left))):
            left -= moved
        await node.mqsc(f"ALTER QLOCAL({hq}) PUT(DISABLED)")
        deadline = time.monotonic() + timeout
        while True:
            while await node.move_batch(hq, target, BATCH):
                pass
            if not (depth := await _depth(node, hq)):
                break
            if time.monotonic() >= deadline:
                raise MoveError(
                    f"{node.q_mgr}: {depth} message(s) on {hq} still being put or inside "
                    f"a unit of work after {timeout:g} s"
                )
            await asyncio.sleep(poll)
    await node.mqsc(f"ALTER QALIAS({journal.route}) TARGET({target})")
    if hq in qs:
        # Left in place (put-inhibited) while a publisher still has it open.
        with contextlib.suppress(MoveError):
            await node.mqsc(f"DELETE QLOCAL({hq}) NOPURGE")


#: Messages a moving sink's backlog queue may hold on its old node when the move
#: starts. Step ``sinks`` waits, with every route holding, until that backlog holds
#: nothing of the stream: a deeper one says the sink's target is down or behind, and
#: the move would turn that sink outage into a publishing outage (bounded only by
#: ``--timeout``).
SINK_BACKLOG_LIMIT = 1000


async def deep_backlogs(nodes: Mapping[str, MoveNode], sinks: list[MovedSink]) -> list[str]:
    """Each sink of ``sinks`` whose backlog queue on its node holds more than
    :data:`SINK_BACKLOG_LIMIT` messages (CURDEPTH: all its streams, a forwarder's
    uncommitted gets included), as "sink S on QM holds N message(s)"."""
    out: list[str] = []
    for q_mgr, sink in sorted({(s.q_mgr, s.sink) for s in sinks}):
        q = (await _node(nodes, q_mgr).queues()).get(backlog_queue_name(sink))
        depth = int(q.get("CURDEPTH", "0") or 0) if q is not None else 0
        if depth > SINK_BACKLOG_LIMIT:
            out.append(f"sink {sink}'s backlog on {q_mgr} holds {depth} message(s)")
    return out


async def sinks_settled(nodes: Mapping[str, MoveNode], journal: MoveJournal) -> str | None:
    """None when the new owner has taken the retained copies (its stream queue's depth
    is 0: committed) and no backlog of a sink to move holds a delivery of the stream
    (its forwarder's uncommitted get included); else what still waits."""
    stream, to = journal.stream, journal.to_q_mgr
    if depth := await _depth(_node(nodes, to), stream):
        return f"{depth} publication(s) on {to}'s {stream}"
    for q_mgr, sink in sorted({(s.q_mgr, s.sink) for s in journal.sinks}):
        if n := await _node(nodes, q_mgr).backlog_holds(sink, stream):
            return f"{n} delivery(ies) of {stream} on {q_mgr}'s backlog of sink {sink}"
    return None


async def move_sinks(
    nodes: Mapping[str, MoveNode], journal: MoveJournal, *, timeout: float = 60.0,
    poll: float = 0.2,
) -> str | None:
    """Step ``sinks``: once :func:`sinks_settled`, the recorded sink subscriptions are
    made on the new owner (NewPubsOnly), then removed from the nodes they were on; None
    when done, else why it must wait. While the routes hold after the drain nothing is
    published, so the old instance's last delivery comes before the new one's first.
    Each command is idempotent (see move_sinks.py): run again after a crash, the step
    ends in the same state."""
    if not journal.sinks:
        return None
    deadline = time.monotonic() + timeout
    while (why := await sinks_settled(nodes, journal)) is not None:
        if time.monotonic() >= deadline:
            return f"sinks not settled after {timeout:g} s: {why}"
        await asyncio.sleep(poll)
    to, stream = journal.to_q_mgr, journal.stream
    new = _node(nodes, to)
    made: set[tuple[str, str, int]] = set()
    try:
        for sub in journal.sinks:
            if (sub.sink, sub.topic, sub.scheme) not in made:
                made.add((sub.sink, sub.topic, sub.scheme))
                await new.sink_command(sub, stream, register=True)
        for sub in journal.sinks:
            if sub.q_mgr != to:
                await _node(nodes, sub.q_mgr).sink_command(sub, stream, register=False)
    finally:  # the reply queues go when the step fails too (a run again defines them)
        for q_mgr in sorted({to, *(s.q_mgr for s in journal.sinks)}):
            with contextlib.suppress(MQError, MoveError):
                await _node(nodes, q_mgr).forget_replies(stream)
    return None


async def run_step(
    step: str,
    nodes: Mapping[str, MoveNode],
    journal: MoveJournal,
    *,
    drain_timeout: float = 60.0,
    poll: float = 0.2,
    retained: RetainedCopies | None = None,
) -> str | None:
    """Carry out ``step``; None when done, else why it must wait (run again).
    ``retained``: what step ``retained`` copies (None: nothing)."""
    kind, _, q_mgr = step.partition(":")
    if kind == "hold":
        await hold(_node(nodes, q_mgr), journal)
        return None
    if kind == "drain":
        deadline = time.monotonic() + drain_timeout
        while (why := await drained(nodes, journal)) is not None:
            if time.monotonic() >= deadline:
                return f"not drained after {drain_timeout:g} s: {why}"
            await asyncio.sleep(poll)
        return None
    if kind == "release":
        await release(_node(nodes, q_mgr), journal, timeout=drain_timeout, poll=poll)
        return None
    if kind == "retained":
        copies = retained() if retained is not None else []
        if copies:
            await _node(nodes, journal.to_q_mgr).put_all(journal.stream, copies)
        return None
    if kind == "sinks":
        return await move_sinks(nodes, journal, timeout=drain_timeout, poll=poll)
    if kind == "finish":
        return None
    raise MoveError(f"unknown step {step!r} in the journal")


def _node(nodes: Mapping[str, MoveNode], q_mgr: str) -> MoveNode:
    try:
        return nodes[q_mgr]
    except KeyError:
        raise MoveError(f"node {q_mgr} is not reachable") from None


async def run_move(
    journal: MoveJournal,
    nodes: Mapping[str, MoveNode],
    save: Callable[[MoveJournal], None],
    *,
    drain_timeout: float = 60.0,
    poll: float = 0.2,
    on_step: Callable[[str], None] | None = None,
    before_step: Callable[[str], Awaitable[None]] | None = None,
    retained: RetainedCopies | None = None,
) -> tuple[MoveJournal, str | None]:
    """Run the steps still to do, saving the journal after each; (journal, None) when
    the move is complete, else (journal, why it stopped)."""
    while (step := next_step(journal)) is not None:
        if before_step is not None:
            await before_step(step)
        try:
            why = await run_step(step, nodes, journal, drain_timeout=drain_timeout, poll=poll,
                                 retained=retained)
        except (MoveError, MQError, OSError) as exc:  # a node went away mid-step
            why = f"{step}: {exc}"
        if why is not None:
            journal = journal.model_copy(update={"waiting": why})
            save(journal)
            return journal, why
        journal = record_done(journal, step)
        save(journal)
        if on_step is not None:
            on_step(step)
    return journal, None


# ------------------------------------------------------- a node over its socket ----


_ATTR = re.compile(r"([A-Z][A-Z0-9]*)\(([^()]*(?:\([^()]*\)[^()]*)*)\)")


def parse_display(lines: list[str]) -> dict[str, dict[str, str]]:
    """``DISPLAY QUEUE(*) ALL`` output: queue name -> attributes."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in lines:
        if line.startswith("AMQ8409I"):
            current = None
            continue
        for key, value in _ATTR.findall(line):
            if key == "QUEUE":
                current = out.setdefault(value, {})
            elif current is not None:
                current[key] = value.strip("'")
    return out


@dataclass
class SocketNode:
    """A running node reached through its queue manager's local socket; ``data_dir``
    its queue manager's data directory (its backlog key seals the sink commands)."""

    name: str
    conn: Connection
    data_dir: Path | None = None

    @property
    def q_mgr(self) -> str:
        return self.name

    async def mqsc(self, script: str) -> None:
        mqsc = getattr(self.conn, "mqsc", None)
        if mqsc is None:
            raise MoveError(f"{self.name}: this connection cannot run MQSC")
        _, results = await mqsc(script)
        for r in results:
            if not r.get("ok"):
                raise MoveError(
                    f"{self.name}: {r.get('text', '?')}: " + " ".join(r.get("lines", []))
                )

    async def queues(self) -> dict[str, dict[str, str]]:
        _, results = await self.conn.mqsc("DISPLAY QUEUE(*) ALL")  # type: ignore[attr-defined]
        lines: list[str] = []
        for r in results:
            lines.extend(r.get("lines", []))
        return parse_display(lines)

    async def in_transmission(self, q_name: str) -> int:
        """Counted from the headers of the messages a browse sees, plus every message
        of the queue's depth it cannot see: one a channel has got in a batch not yet
        committed (or a put not yet committed) may be for ``q_name`` too."""
        qs = await self.queues()
        count = 0
        for name, attrs in qs.items():
            depth = int(attrs.get("CURDEPTH", "0") or 0)
            if attrs.get("USAGE") != "XMITQ" or not depth:
                continue
            seen, matching = await self._count_for(name, q_name)
            count += matching + max(0, depth - seen)
        return count

    async def _count_for(self, xmitq: str, q_name: str) -> tuple[int, int]:
        """(messages browsed, those whose header names ``q_name``)."""

        def for_q_name(md: MQMD, body: bytes) -> bool:
            if md.format != FMT_XMIT_Q_HEADER:
                return False
            try:
                return unwrap_from_xmitq(md, body).remote_q_name == q_name
            except WireError:
                return False

        return await self._browse_count(xmitq, for_q_name)

    async def _browse_count(self, queue: str, matches: Callable[[MQMD, bytes], bool]
                            ) -> tuple[int, int]:
        """(messages a browse of ``queue`` sees, those ``matches``)."""
        h = await self.conn.open(queue, OpenOption.BROWSE)
        count = seen = 0
        try:
            browse = Browse.FIRST
            while True:
                try:
                    msg = await h.get(GetOptions(browse=browse))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        return seen, count
                    raise
                seen += 1
                browse = Browse.NEXT
                if matches(msg.md, msg.body):
                    count += 1
        finally:
            await h.close()

    #: Seconds a batch waits for the holding queue to be free (see move_batch).
    exclusive_wait: float = 15.0

    async def move_batch(self, source: str, target: str, limit: int) -> int:
        """Opened for exclusive input: a move killed in the middle of a batch leaves its
        gets uncommitted until its queue manager has backed them out, and moving the
        messages behind them meanwhile would put those first."""
        deadline = time.monotonic() + self.exclusive_wait
        while True:
            try:
                src = await self.conn.open(source, OpenOption.INPUT_EXCLUSIVE)
                break
            except MQError as exc:
                if exc.reason != Reason.OBJECT_IN_USE:
                    raise
                if time.monotonic() >= deadline:
                    raise MoveError(
                        f"{self.name}: {source} stays open for input elsewhere (another "
                        "move running?)"
                    ) from None
                await asyncio.sleep(0.1)
        dst = await self.conn.open(target, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        moved = 0
        try:
            while moved < limit:
                try:
                    msg = await src.get(GetOptions(syncpoint=True))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        break
                    raise
                await dst.put(msg.md, msg.body, PutOptions(syncpoint=True, set_all_context=True))
                moved += 1
            await self.conn.commit()
        except BaseException:
            with contextlib.suppress(MQError):
                await self.conn.backout()
            raise
        finally:
            for h in (src, dst):
                with contextlib.suppress(MQError):
                    await h.close()
        return moved

    async def put_all(self, target: str, messages: list[tuple[MQMD, bytes]]) -> None:
        dst = await self.conn.open(target, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        try:
            for start in range(0, len(messages), BATCH):
                try:
                    for md, body in messages[start:start + BATCH]:
                        await dst.put(md, body, PutOptions(syncpoint=True,
                                                           set_all_context=True))
                    await self.conn.commit()
                except BaseException:
                    with contextlib.suppress(MQError):
                        await self.conn.backout()
                    raise
        finally:
            with contextlib.suppress(MQError):
                await dst.close()

    async def backlog_holds(self, sink: str, stream: str) -> int:
        """Browsed messages whose envelope is of ``stream``, plus every message of the
        depth a browse cannot see (a get the forwarder has not committed may be one)."""
        queue = backlog_queue_name(sink)
        q = (await self.queues()).get(queue)
        depth = int(q.get("CURDEPTH", "0") or 0) if q is not None else 0
        if not depth:
            return 0

        def of_stream(md: MQMD, body: bytes) -> bool:
            try:
                return decode_backlog_message(body).stream == stream
            except BacklogFormatError:
                return False  # its forwarder dead-letters it: nothing of the stream

        seen, count = await self._browse_count(queue, of_stream)
        return count + max(0, depth - seen)

    #: Seconds the broker has to answer a sink command.
    answer_wait: float = 30.0

    async def sink_command(self, sub: MovedSink, stream: str, *, register: bool) -> None:
        command = "RegSub" if register else "DeregSub"
        key = self.backlog_key()
        reply = reply_queue_name(stream)
        if reply not in await self.queues():
            await self.mqsc(f"DEFINE QLOCAL({reply}) DESCR('answers to mqgw streams move')")
        msg_id = os.urandom(24)
        md, body = sink_command(sub, stream, register=register, q_mgr=self.name,
                                reply_q=reply, msg_id=msg_id)
        seal_command(key, md, body, time.time())  # the broker's only proof it is ours
        control = await self.conn.open(CONTROL_QUEUE,
                                       OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        try:
            await control.put(md, body, PutOptions(set_all_context=True))
        finally:
            await control.close()
        h = await self.conn.open(reply, OpenOption.INPUT_SHARED)
        try:
            msg = await h.get(GetOptions(wait_ms=int(self.answer_wait * 1000),
                                         match_correl_id=msg_id))
        except MQError as exc:
            if exc.reason == Reason.NO_MSG_AVAILABLE:
                raise MoveError(f"{self.name}: its broker did not answer the {command} of "
                                f"sink {sub.sink} within {self.answer_wait:g} s") from None
            raise
        finally:
            await h.close()
        outcome = command_outcome(msg.md, msg.body)
        if outcome is None:
            raise MoveError(f"{self.name}: the answer to the {command} of sink {sub.sink} "
                            "is no broker response")
        if refused(outcome, register=register):
            raise MoveError(
                f"{self.name}: its broker refused the {command} of sink {sub.sink} on "
                f"{stream} {sub.topic!r}: {outcome[1]} {reason_text(outcome[1])}")

    def backlog_key(self) -> bytes:
        """This node's backlog key (gateway/runtime/backlog_seal.py), read, never made;
        MoveError when it cannot be read."""
        if self.data_dir is None:
            raise MoveError(f"{self.name}: no data directory to read its backlog key from")
        path = self.data_dir / KEY_FILE
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise MoveError(
                f"{self.name}: cannot read its backlog key {path} ({exc.strerror}): the "
                "sink commands are sealed with it; run the move as a user who may read "
                "the gateway's data directory") from None
        if len(key) != KEY_SIZE:
            raise MoveError(f"{self.name}: {path} is not a backlog key")
        return key

    async def forget_replies(self, stream: str) -> None:
        with contextlib.suppress(MoveError):
            if reply_queue_name(stream) in await self.queues():
                await self.mqsc(f"DELETE QLOCAL({reply_queue_name(stream)}) PURGE")


async def connect_nodes(data_dirs: Mapping[str, Path]) -> dict[str, SocketNode]:
    """Connect to every running node; MoveError naming the ones that do not answer."""
    from gateway.mq.embedded.client import connect_local

    nodes: dict[str, SocketNode] = {}
    missing: list[str] = []
    for name, d in data_dirs.items():
        try:
            conn = await connect_local(d, appl_name="mqgw streams move")
        except MQError as exc:
            missing.append(f"{name} ({exc})")
            continue
        if conn.q_mgr_name != name:
            await conn.disconnect()
            raise MoveError(f"{d} serves queue manager {conn.q_mgr_name}, not {name}")
        nodes[name] = SocketNode(name, conn, d)
    if missing:
        await close_nodes(nodes)
        raise MoveError(
            "not running (a move needs every node's gateway running): " + ", ".join(missing)
        )
    return nodes


async def close_nodes(nodes: Mapping[str, SocketNode]) -> None:
    for node in nodes.values():
        with contextlib.suppress(MQError):
            await node.conn.disconnect()

