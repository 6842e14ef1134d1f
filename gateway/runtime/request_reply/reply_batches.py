"""The replies waiting together on the reply queue, in one MQ unit of work
(docs/request-reply.md, "Batches of replies").

Why: one reply per unit of work costs a produce round trip to the requester's broker,
a durable write of its entry and an MQ commit, one reply after the other; with many
requests in flight their replies queue behind each other's acknowledgements and disk
flushes. Here the replies already on the queue when one arrives are got under one unit
of work and produced together (one produce per plugin instance), their entries finished
in one transaction, and the unit committed once.

Each reply keeps the order of the once/in-order table: produced (acknowledged), then
its entry finished, then the commit of its get. A message is got only after the one
before it is handled, so the unit never commits the get of a message not handled yet.
Anything unusual (no open entry, a COA/COD notice, a reply topic refused, a message
backed out before, the same entry twice) first sends what was gathered and then goes
the one-message way, whose commit then covers all of it. A failure raises: the caller
backs the unit out (replies produced and finished are filtered when got again) and
takes the next messages one per unit of work until one succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.mq.port import Connection, GetOptions, Message, MQError, QueueHandle
from gateway.plugin_api import DeliveryRefusedError, Envelope, PluginError
from gateway.routing.addressing import classify, error_envelope, reply_envelope
from gateway.routing.correlation import PendingRequest, State
from gateway.routing.routes import RequestRoute

if TYPE_CHECKING:
    from gateway.runtime.request_reply.service import RequestReplyService

__all__ = ["MAX_REPLIES_PER_UNIT", "read_replies_together"]

#: Most replies in one unit of work (far below MQ's MaxUncommittedMsgs).
MAX_REPLIES_PER_UNIT = 100
_NO_MSG = 2033

#: Handles one message the one-message way and commits (the reader's handler, with
#: its BOTHRESH give-up).
HandleOne = Callable[[Connection, Message], Awaitable[None]]


@dataclass(slots=True)
class _Gathered:
    """One reply ready to go: its message, entry, route and envelope."""

    msg: Message
    pending: PendingRequest
    route: RequestRoute
    env: Envelope
    kind: str


@dataclass(slots=True)
class _Run:
    """Replies gathered since the last send, each holding its entry's lock."""

    locks: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    items: list[_Gathered] = field(default_factory=list)
    keys: set[bytes] = field(default_factory=set)


async def read_replies_together(
    svc: RequestReplyService,
    conn: Connection,
    handle: QueueHandle,
    first: Message,
    *,
    backout_limit: int,
    one: HandleOne,
) -> None:
    """Handle ``first`` and the messages behind it on the reply queue (up to
    :data:`MAX_REPLIES_PER_UNIT`, those there now) in one unit of work, committed at
    the end (module docstring)."""
    run = _Run()
    try:
        msg: Message | None = first
        handled = 0
        while msg is not None:
            gathered = await _gather(svc, run, msg, backout_limit)
            if not gathered:
                await _send(svc, conn, run)
                await one(conn, msg)  # commits: everything got so far is handled
            handled += 1
            msg = None
            if handled < MAX_REPLIES_PER_UNIT and svc.running:
                msg = await _next(handle)
        await _send(svc, conn, run)
        await conn.commit()
    finally:
        await run.locks.aclose()


async def _next(handle: QueueHandle) -> Message | None:
    try:
        return await handle.get(GetOptions(wait_ms=0, syncpoint=True))
    except MQError as exc:
        if exc.reason == _NO_MSG:
            return None
        raise


async def _gather(svc: RequestReplyService, run: _Run, msg: Message, backout_limit: int) -> bool:
    """Add ``msg`` to ``run`` (holding its entry's lock) when it is a final answer to an
    open entry whose reply topic is allowed; False: it goes the one-message way."""
    md = msg.md
    key = md.correl_id
    if md.backout_count >= backout_limit or key in run.keys:
        return False
    kind = classify(md)
    if not kind.final:
        return False
    pending = svc.store.request(key)
    route = svc.requests.get(pending.route) if pending is not None else None
    if pending is None or route is None or pending.state is not State.OPEN:
        return False
    await run.locks.enter_async_context(svc.entry_lock(key))
    run.keys.add(key)
    pending = svc.store.request(key)  # again under the lock: the sweeper may have ended it
    if (
        pending is None
        or pending.state is not State.OPEN
        or not svc.reply_topic_decision(route, pending.reply_topic).allowed
    ):  # refused: counted and reported once, on the one-message way
        return False
    if kind.kind == "reply":
        env = reply_envelope(pending, md, msg.body)
    else:
        env = error_envelope(pending, kind.kind, feedback=kind.feedback)
    run.items.append(_Gathered(msg, pending, route, env, kind.kind))
    return True


async def _send(svc: RequestReplyService, conn: Connection, run: _Run) -> None:
    """Produce the gathered replies (one produce per plugin instance, in order), then
    finish their entries in one transaction; release their locks. A reply the plugin
    refuses for good gets the one-message way's treatment (error reply, dead-lettered,
    entry ``refused``) under this unit of work; the others are produced again, as the
    publication path does (docs/request-reply.md, "Batches of replies")."""
    try:
        by_plugin: dict[str, list[_Gathered]] = {}
        for item in run.items:
            by_plugin.setdefault(item.route.plugin, []).append(item)
        for items in by_plugin.values():
            await _produce(svc, conn, items)
    finally:
        run.items.clear()
        run.keys.clear()
        await run.locks.aclose()
        run.locks = contextlib.AsyncExitStack()


async def _produce(svc: RequestReplyService, conn: Connection, items: list[_Gathered]) -> None:
    todo = items
    while todo:
        try:
            await svc.produce(todo[0].route.plugin, [item.env for item in todo])
        except DeliveryRefusedError as exc:
            # as the publication path does: nothing of a refused batch counts as
            # produced; the refused reply is handled, the others produced again
            index = exc.index if 0 <= exc.index < len(todo) else 0
            await _refused(svc, conn, todo[index], exc)
            todo = todo[:index] + todo[index + 1 :]
            continue
        except PluginError as exc:
            if exc.retriable:
                for item in todo:
                    svc.reply_failing_since.setdefault(item.route.name, svc.clock())
            raise
        await _finish(svc, todo)
        return


async def _finish(svc: RequestReplyService, items: list[_Gathered]) -> None:
    """Entries of produced replies: finished in one transaction (its flush off the
    event loop, which meanwhile serves the requests), then counted."""
    if not items:
        return
    outcomes = [(item.pending.key, item.kind) for item in items]
    await asyncio.to_thread(svc.store.finish_requests, outcomes, svc.clock())
    for item in items:
        svc.reply_failing_since.pop(item.route.name, None)
        event = "replies_delivered" if item.kind == "reply" else f"error_replies.{item.kind}"
        svc.count(item.route.name, event)


async def _refused(
    svc: RequestReplyService, conn: Connection, item: _Gathered, exc: DeliveryRefusedError
) -> None:
    """The plugin refused this reply for good: its requester hears of it with one error
    reply "refused", the reply goes to the DLQ with the plugin's reason, the entry ends
    ``refused`` (as the one-message way does; the commit is the unit's)."""
    route, pending, msg = item.route, item.pending, item.msg
    await svc.error_reply_or_give_up(
        route, pending, error_envelope(pending, "refused", feedback=exc.reason, text=str(exc))
    )
    await svc.dead_letter(conn, msg.md, msg.body, exc.reason, svc.config.reply_queue, "")
    svc.store.finish_request(pending.key, "refused", svc.clock())
    svc.count(route.name, "replies_dead_lettered")
