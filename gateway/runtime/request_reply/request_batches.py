"""The requests of one plugin batch in one MQ unit of work (docs/request-reply.md,
"Batches of requests").

Why: sent one per unit of work, each request costs three durable writes in a row: its
correlation entry, the MQ commit and its "sent" mark. Requests in flight together then
queue behind each other's disk flushes. Here a batch's entries are written in one
transaction, its puts committed in one unit of work and its marks written in one
transaction: three flushes for the batch.

Each request's hops keep their order: its entry is on disk before its put commits, and
it is marked sent only after the commit. Anything unusual ends this path with nothing
put or marked: a request that cannot be built, one identity twice in the batch, a put or
a commit that fails. The caller then sends the batch one request per unit of work,
the path that gives each request its own outcome (an error reply for a refused put, a
dead letter, the index of a refusal). Entries written here are found there and not
written again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.mq.port import Connection, MQError, PutItem, PutOptions, put_many
from gateway.plugin_api import Envelope
from gateway.routing.addressing import correlation_key, request_md, request_message
from gateway.routing.correlation import PendingRequest, State, request_token, source_id
from gateway.routing.routes import RequestRoute, split_destination
from gateway.wire.mqmd import MQMD

if TYPE_CHECKING:
    from gateway.runtime.request_reply.service import RequestReplyService

__all__ = ["MAX_REQUESTS_PER_UNIT", "RequestPlan", "plan_request", "send_requests_together"]

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


def plan_request(
    svc: RequestReplyService, route: RequestRoute, env: Envelope, now: float
) -> RequestPlan | None:
    """The plan of request ``env``; None when it was sent already or is finished (a
    redelivery, filtered)."""
    sid = source_id(route.name, env)
    msg_id = request_token(sid)
    key = correlation_key(route, msg_id)
    existing = svc.store.request(key)
    if existing is not None and (existing.sent or existing.state is State.DONE):
        return None
    entry = None
    if existing is None:
        entry = PendingRequest(
            key=key,
            route=route.name,
            source_id=sid,
            reply_topic=env.reply_topic or route.default_reply_topic(env.topic),
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
    q, q_mgr = split_destination(route.destination)
    keys: list[bytes] = []
    seen: set[bytes] = set()
    puts: list[PutItem] = []
    new: list[PendingRequest] = []
    duplicates = 0
    try:
        for env in unit:
            plan = plan_request(svc, route, env, now)
            if plan is None:
                duplicates += 1
                continue
            if plan.key in seen:
                return False  # one request twice: the one-by-one path filters the second
            seen.add(plan.key)
            if plan.entry is not None:
                new.append(plan.entry)
            keys.append(plan.key)
            puts.append((q, q_mgr, plan.md, plan.body))
    except Exception as exc:  # the one-by-one path raises it again, at its index
        log.debug("route %s: batch sent one request at a time: %s", route.name, exc)
        return False
    if puts:
        svc.store.add_requests(new)
        try:
            results = await put_many(conn, puts, PutOptions(syncpoint=True))
            failed = next((r for r in results if isinstance(r, MQError)), None)
            if failed is not None:
                raise failed
            await conn.commit()
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            log.debug("route %s: batch sent one request at a time: %s", route.name, exc)
            return False
        except BaseException:
            with contextlib.suppress(MQError):
                await conn.backout()
            raise
        svc.store.mark_all_sent(keys)
        svc.count(route.name, "requests_sent", len(keys))
    if duplicates:
        svc.count(route.name, "duplicates_filtered", duplicates)
    return True
