"""The requests of one plugin batch in one MQ unit of work (docs/request-reply.md,
"Batches of requests").

Why: sent one per unit of work, each request costs its correlation entry's flush, the
MQ commit's and its "sent" mark. Requests in flight together then queue behind each
other's disk flushes. Here a unit's requests are put under one unit of work, their
entries written in one transaction, the unit committed once and the marks written in
one transaction: two flushes for the unit (the marks have none of their own:
gateway.routing.correlation_store).

Each request's hops keep their order: its entry is on disk before its put commits, and
it is marked sent only after the commit (commit and marks as one step a cancel cannot
split). Anything unusual ends this path for the unit with nothing of it committed: a
request that cannot be planned, one identity twice in the unit, a put or a commit that
fails (the puts stop at the first failure). The caller then sends the requests from
that unit on one per unit of work, the path that gives each request its own outcome (an
error reply for a refused put, the index of a refusal). Entries written here are found
there and not written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.mq.port import Connection, MQError, PutOptions
from gateway.plugin_api import Envelope
from gateway.pubsub.destinations import QueueUse
from gateway.routing.addressing import correlation_key, request_md, request_message
from gateway.routing.correlation import PendingRequest, State, request_token, source_id
from gateway.routing.routes import RequestRoute, split_destination
from gateway.wire.mqmd import MQMD

if TYPE_CHECKING:
    from gateway.runtime.request_reply.service import RequestReplyService

__all__ = [
    "MAX_REQUESTS_PER_UNIT",
    "RequestPlan",
    "plan_request",
    "reply_topic_of",
    "send_requests_together",
]

log = logging.getLogger(__name__)

#: Most requests in one unit of work (far below MQ's MaxUncommittedMsgs, 10,000 by
#: default); a larger batch is sent in several units, in order.
MAX_REQUESTS_PER_UNIT = 100


async def send_requests_together(
    svc: RequestReplyService, conn: Connection, route: RequestRoute, batch: Sequence[Envelope]
) -> int:
    """Send ``batch`` as MQ REQUESTs, ``MAX_REQUESTS_PER_UNIT`` per unit of work; how
    many of its first requests are done (sent, or filtered as duplicates). Less than
    ``len(batch)``: the next unit found something unusual (module docstring) and
    committed nothing; the caller sends the requests from there one at a time."""
    done = 0
    while done < len(batch):
        unit = batch[done : done + MAX_REQUESTS_PER_UNIT]
        if not await _send_unit(svc, conn, route, unit):
            break
        done += len(unit)
    return done


@dataclass(slots=True)
class RequestPlan:
    """What sending one request takes (both paths): its correlation key, the entry to
    record first (None: recorded before and not sent yet) and the MQ message."""

    key: bytes
    entry: PendingRequest | None
    md: MQMD
    body: bytes


def reply_topic_of(route: RequestRoute, env: Envelope) -> str:
    """Where request ``env``'s reply goes: its own reply topic, else the route's."""
    return env.reply_topic or route.default_reply_topic(env.topic)


def plan_request(
    svc: RequestReplyService, route: RequestRoute, env: Envelope, now: float
) -> RequestPlan | None:
    """The plan of request ``env``; None when it was sent already or is finished (a
    redelivery, filtered). Its reply topic is checked before (:func:`reply_topic_of`)."""
    sid = source_id(route.name, env)
    msg_id = request_token(sid)
    key = correlation_key(route, msg_id)
    existing = svc.store.request(key)
    if existing is not None and (existing.sent or existing.state is State.DONE):
        return None
    reply_topic = reply_topic_of(route, env)
    entry = None
    if existing is None:
        entry = PendingRequest(
            key=key,
            route=route.name,
            source_id=sid,
            reply_topic=reply_topic,
            correlation_data=env.correlation_data,
            msg_id=msg_id,
            deadline=now + route.timeout,
        )
    cfg = svc.config
    md = request_md(
        route,
        env,
        msg_id=msg_id,
        reply_to_q=cfg.effective_reply_to_q,
        reply_to_q_mgr=cfg.reply_to_q_mgr,
        now=now,
    )
    md, body = request_message(md, env)
    return RequestPlan(key, entry, md, body)


async def _send_unit(
    svc: RequestReplyService, conn: Connection, route: RequestRoute, unit: Sequence[Envelope]
) -> bool:
    now = svc.clock()
    plans: list[RequestPlan] = []
    seen: set[bytes] = set()
    duplicates = 0
    try:
        for env in unit:
            if not svc.reply_topic_decision(route, reply_topic_of(route, env)).allowed:
                return False  # refused (and counted) on the one-by-one path, at its index
            plan = plan_request(svc, route, env, now)
            if plan is None:
                duplicates += 1
                continue
            if plan.key in seen:
                return False  # one request twice: the one-by-one path filters the second
            seen.add(plan.key)
            plans.append(plan)
    except Exception as exc:  # the one-by-one path raises it again, at its index
        log.debug("route %s: batch sent one request at a time: %s", route.name, exc)
        return False
    if plans:
        try:
            await _put_all(svc, conn, route, plans)
            # the entries are on disk before the puts commit (a crash in between backs
            # the puts out); recorded only now, so a failed put leaves no extra entries
            await asyncio.to_thread(
                svc.store.add_requests, [p.entry for p in plans if p.entry is not None]
            )
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            log.debug("route %s: batch sent one request at a time: %s", route.name, exc)
            return False
        except BaseException:
            with contextlib.suppress(MQError):
                await conn.backout()
            raise
        if not await _commit_and_mark(svc, conn, route, [p.key for p in plans]):
            return False
        svc.count(route.name, "requests_sent", len(plans))
    if duplicates:
        svc.count(route.name, "duplicates_filtered", duplicates)
    return True


async def _put_all(
    svc: RequestReplyService,
    conn: Connection,
    route: RequestRoute,
    plans: Sequence[RequestPlan],
) -> None:
    """Put every planned request under syncpoint through one open of the route's
    destination (where MQ resolved it checked: never one of the gateway's own queues),
    stopping at the first failure: on IBM MQ a put after a broken connection would
    reconnect, with backoff, for each request still to put."""
    q, q_mgr = split_destination(route.destination)
    opts = PutOptions(syncpoint=True)
    handle = await svc.open_destination(conn, route.name, q, q_mgr, QueueUse.DESTINATION, opts)
    try:
        for plan in plans:
            await handle.put(plan.md, plan.body, opts)
    finally:
        with contextlib.suppress(MQError):
            await handle.close()


async def _commit_and_mark(
    svc: RequestReplyService, conn: Connection, route: RequestRoute, keys: list[bytes]
) -> bool:
    """Commit the unit and mark its requests sent, as one step a cancel (the plugin
    stopping) cannot split: a commit without the marks would put the whole unit again
    when the batch is redelivered. False: the commit failed and the unit is backed out.
    (A commit whose outcome is unknown, the connection lost during it, may have put
    the unit: the one-by-one path then puts it again, as it would one request.)"""

    async def step() -> bool:
        try:
            await conn.commit()
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            log.debug("route %s: batch sent one request at a time: %s", route.name, exc)
            return False
        svc.store.mark_all_sent(keys)  # no flush of its own: quick on the loop
        return True

    task = asyncio.ensure_future(step())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})  # the commit and the marks end first
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("route %s: marking a unit of requests sent failed: %s", route.name, exc)
        raise
