"""The MQ-side loops of the request/reply service: the reply-queue reader, one reader per
service queue, and the timeout sweeper (docs/request-reply.md, once/in-order table).

Each loop owns its connection (an MQ connection owns one unit of work) and reconnects
with backoff when the queue manager is unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.mq.port import (
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    QueueAttr,
    QueueHandle,
)
from gateway.plugin_api import DeliveryRefusedError, Envelope, PluginError
from gateway.pubsub.destinations import QueueUse
from gateway.routing.addressing import (
    classify,
    error_envelope,
    reply_envelope,
    report_md,
    wants_report,
)
from gateway.routing.correlation import PendingRequest, PendingService, State
from gateway.routing.routes import ServiceRoute
from gateway.wire.constants import Feedback, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.folder import usr_properties_of
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh2 import decode_rfh2

if TYPE_CHECKING:
    from gateway.runtime.request_reply.service import RequestReplyService

from gateway.runtime.request_reply.errors import DeadLetterRefusedError, DestinationBusyError
from gateway.runtime.request_reply.reply_batches import read_replies_together

log = logging.getLogger(__name__)

#: MQFB_APPL_FIRST + 1: the MQDLH reason of a reply no pending request waits for.
NO_PENDING_REQUEST = 65537
#: MQRC_BACKOUT_THRESHOLD_REACHED: the MQDLH reason of a reply backed out too often.
BACKOUT_THRESHOLD_REACHED = 2362
#: Gets of one reply before it is dead-lettered, when the reply queue has no BOTHRESH.
BACKOUT_LIMIT = 3
_NO_MSG = 2033
#: The outcome (and event) of an entry the sweeper gave up (``undeliverable_after``).
UNDELIVERABLE = "undeliverable"
#: Task names (health: :meth:`RequestReplyService.failing_tasks`).
TASK_REPLIES = "rr:replies"
TASK_SERVICE = "rr:service:"
TASK_SWEEPER = "rr:sweeper"
_MAX_BACKOFF = 5.0


async def _open(svc: RequestReplyService, queue: str) -> tuple[Connection, QueueHandle]:
    conn = await svc.qm.connect()
    try:
        handle = await conn.open(queue, OpenOption.INPUT_SHARED | OpenOption.FAIL_IF_QUIESCING)
    except BaseException:
        with contextlib.suppress(MQError):
            await conn.disconnect()
        raise
    return conn, handle


async def _serve(
    svc: RequestReplyService,
    queue: str,
    what: str,
    handle_one: Callable[[Connection, Message], Awaitable[None]],
    *,
    task: str,
    give_up: Callable[[Connection, Message], Awaitable[bool]] | None = None,
    together: Together | None = None,
) -> None:
    """Get each message of ``queue`` under syncpoint and hand it to ``handle_one``,
    which commits; a retriable failure backs out and retries with backoff.

    ``give_up``: a message already backed out the queue's BOTHRESH times (or
    :data:`BACKOUT_LIMIT` when it has none) is first offered to ``give_up``, which may
    take it (True), so one message whose route is down cannot hold back the messages
    behind it for long.

    ``together``: handles a message and those behind it in one unit of work
    (reply_batches.py); after a failure, messages go one per unit of work until one
    succeeds, so a failing message is backed out alone, as without it."""
    delay = 0.1
    one_by_one = together is None
    while svc.running:
        try:
            conn, handle = await _open(svc, queue)
        except MQError as exc:
            log.warning("%s: cannot open %s: %s (retrying)", what, queue, exc)
            await asyncio.sleep(delay)
            delay = min(_MAX_BACKOFF, delay * 2)
            continue
        try:
            limit = await _backout_limit(handle) if give_up is not None else 0
            single = functools.partial(_one_message, handle_one, give_up, limit)
            while svc.running:
                try:
                    msg = await handle.get(GetOptions(wait_ms=svc.wait_ms, syncpoint=True))
                except MQError as exc:
                    if exc.reason == _NO_MSG:
                        svc.task_ok(task)
                        continue
                    raise
                try:
                    if together is not None and not one_by_one:
                        await together(conn, handle, msg, limit, single)
                    else:
                        await single(conn, msg)
                    delay = 0.1
                    one_by_one = together is None
                    svc.task_ok(task)
                except PluginError as exc:
                    with contextlib.suppress(MQError):
                        await conn.backout()
                    one_by_one = True
                    svc.summarised.log(
                        logging.WARNING, f"{what} retry",
                        "%s: %s (message kept, retrying)", what, exc,
                    )
                    await asyncio.sleep(delay)
                    delay = min(_MAX_BACKOFF, delay * 2)
        except MQError as exc:
            log.warning("%s: %s (reconnecting)", what, exc)
            await asyncio.sleep(delay)
            delay = min(_MAX_BACKOFF, delay * 2)
        finally:
            with contextlib.suppress(MQError):
                await conn.backout()
            with contextlib.suppress(MQError):
                await conn.disconnect()


async def _one_message(
    handle_one: Callable[[Connection, Message], Awaitable[None]],
    give_up: Callable[[Connection, Message], Awaitable[bool]] | None,
    limit: int,
    conn: Connection,
    msg: Message,
) -> None:
    """One message in its own unit of work: offered to ``give_up`` first when it was
    backed out ``limit`` times, else to ``handle_one`` (both commit)."""
    if give_up is not None and msg.md.backout_count >= limit and await give_up(conn, msg):
        return
    await handle_one(conn, msg)


#: Handles a message got under syncpoint and those behind it, then commits:
#: (connection, queue handle, the message, the queue's backout limit, the one-message
#: handler).
Together = Callable[
    [Connection, QueueHandle, Message, int, Callable[[Connection, Message], Awaitable[None]]],
    Awaitable[None],
]


async def _backout_limit(handle: QueueHandle) -> int:
    """The queue's BOTHRESH, or :data:`BACKOUT_LIMIT` when it has none (0)."""
    try:
        attrs = await handle.inquire(QueueAttr.BACKOUT_THRESHOLD)
        value = int(attrs.get(QueueAttr.BACKOUT_THRESHOLD, 0) or 0)
    except (MQError, ValueError, TypeError):
        value = 0
    return value if value > 0 else BACKOUT_LIMIT


# ------------------------------------------------------------------- replies ---------


async def read_replies(svc: RequestReplyService) -> None:
    async def one(conn: Connection, msg: Message) -> None:
        pending = svc.store.request(msg.md.correl_id)
        route = pending.route if pending is not None else ""
        try:
            await handle_reply(svc, conn, msg)
        except PluginError as exc:
            if exc.retriable:
                svc.reply_failing_since.setdefault(route, svc.clock())
            raise
        svc.reply_failing_since.pop(route, None)

    async def give_up(conn: Connection, msg: Message) -> bool:
        return await give_up_reply(svc, conn, msg)

    async def together(
        conn: Connection,
        handle: QueueHandle,
        msg: Message,
        limit: int,
        single: Callable[[Connection, Message], Awaitable[None]],
    ) -> None:
        await read_replies_together(svc, conn, handle, msg, backout_limit=limit, one=single)

    await _serve(svc, svc.config.reply_queue, "reply queue", one, task=TASK_REPLIES,
                 give_up=give_up, together=together)


async def give_up_reply(svc: RequestReplyService, conn: Connection, msg: Message) -> bool:
    """A reply backed out BOTHRESH times whose route has been failing for
    ``svc.reply_retry`` seconds (its plugin stays down, not just restarting): to the DLQ
    with MQRC_BACKOUT_THRESHOLD_REACHED (True). The request's entry stays open: its
    requester gets the timeout error reply once the plugin is back. False: not yet."""
    pending = svc.store.request(msg.md.correl_id)
    route = pending.route if pending is not None else ""
    since = svc.reply_failing_since.get(route)
    if since is None or svc.clock() - since < svc.reply_retry:
        return False
    svc.summarised.log(
        logging.WARNING, f"reply backed out {route}",
        "reply queue: reply with CorrelId %s (route %s) backed out %d times: dead-lettered",
        msg.md.correl_id.hex(), route or "?", msg.md.backout_count,
    )
    await svc.dead_letter(
        conn, msg.md, msg.body, BACKOUT_THRESHOLD_REACHED, svc.config.reply_queue, ""
    )
    await conn.commit()
    svc.count(route, "replies_backed_out")
    return True


async def handle_reply(svc: RequestReplyService, conn: Connection, msg: Message) -> None:
    """Reply → requester: produce → finish_request → MQ commit."""
    md = msg.md
    async with svc.entry_lock(md.correl_id):
        await _handle_reply(svc, conn, msg)


async def _handle_reply(svc: RequestReplyService, conn: Connection, msg: Message) -> None:
    md = msg.md
    kind = classify(md)
    pending = svc.store.request(md.correl_id)
    route = svc.requests.get(pending.route) if pending is not None else None
    reply_queue = svc.config.reply_queue
    if pending is None or route is None:
        svc.summarised.log(
            logging.INFO, "reply unmatched",
            "reply queue: message with CorrelId %s matches no request: dead-lettered "
            "(MQDLH reason %d)", md.correl_id.hex(), NO_PENDING_REQUEST,
        )
        await svc.dead_letter(conn, md, msg.body, NO_PENDING_REQUEST, reply_queue, "")
        await conn.commit()
        svc.count(pending.route if pending else "", "replies_unmatched")
        return
    if pending.state is State.DONE:
        if pending.outcome == "reply" or not kind.final:
            svc.count(route.name, "duplicates_filtered")
        else:
            # late: after a timeout, refusal, exception or expiry the requester got
            # its error reply already
            await svc.dead_letter(conn, md, msg.body, NO_PENDING_REQUEST, reply_queue, "")
            svc.count(route.name, "replies_late")
        await conn.commit()
        return
    if kind.kind == "reply":
        env = reply_envelope(pending, md, msg.body)
    else:
        env = error_envelope(pending, kind.kind, feedback=kind.feedback)
    refused = svc.reply_topic_refusal(route, pending.reply_topic)
    try:
        if refused is not None:
            raise refused  # the reply topic became one of the gateway's own meanwhile
        await svc.produce(route.plugin, [env])
    except DeliveryRefusedError as exc:
        if exc is not refused:
            # The plugin refused the reply: the requester still hears of it, with one
            # (small) error reply "refused" (nothing goes to a refused topic).
            await svc.error_reply_or_give_up(
                route, pending,
                error_envelope(pending, "refused", feedback=exc.reason, text=str(exc)),
            )
        await svc.dead_letter(conn, md, msg.body, exc.reason, reply_queue, "")
        svc.store.finish_request(pending.key, "refused", svc.clock())
        await conn.commit()
        svc.count(route.name, "replies_dead_lettered")
        return
    if kind.final:
        svc.store.finish_request(pending.key, kind.kind, svc.clock())
    await conn.commit()
    event = "replies_delivered" if kind.kind == "reply" else f"error_replies.{kind.kind}"
    svc.count(route.name, event)


# ------------------------------------------------------------------- service queues --


async def read_service_queue(svc: RequestReplyService, route: ServiceRoute) -> None:
    async def one(conn: Connection, msg: Message) -> None:
        await handle_service_request(svc, route, conn, msg)

    await _serve(svc, route.queue, f"service route {route.name}", one,
                 task=f"{TASK_SERVICE}{route.name}")


def _body_of(md_format: str, encoding: int, ccsid: int, body: bytes) -> tuple[
    bytes, str, int, int, list[tuple[str, str]]
]:
    """(payload, its format, encoding, CCSID, usr properties): an MQRFH2 stripped."""
    if md_format.strip() != FMT_RF_HEADER_2.strip():
        return body, md_format, encoding, ccsid, []
    rfh2, length = decode_rfh2(body, encoding, ccsid=ccsid)
    props = [p for f in rfh2.folders_named("usr") for p in usr_properties_of(f)[0]]
    return body[length:], rfh2.format, rfh2.encoding, rfh2.coded_char_set_id, props


async def handle_service_request(
    svc: RequestReplyService, route: ServiceRoute, conn: Connection, msg: Message
) -> None:
    """MQ request → responder: add_service (open, not produced) → produce →
    mark_service_produced → MQ commit. The entry exists before the responder can see
    the request, so its answer finds the entry even across a crash and restart."""
    md = msg.md
    now = svc.clock()
    is_request = md.msg_type == MsgType.REQUEST and bool(md.reply_to_q.strip())
    token = md.msg_id
    existing = svc.store.service(token) if is_request else None
    if existing is not None and (existing.produced or existing.state is State.DONE):
        await conn.commit()
        svc.count(route.name, "duplicates_filtered")
        return
    if is_request:
        # Where the reply would go, named by the requester: resolved and checked before
        # the responder ever sees the request (docs/security.md).
        who = svc.authoriser.principal_of(md.user_identifier)
        decision = svc.authoriser.may_use_queue(
            who, md.reply_to_q_mgr, md.reply_to_q, QueueUse.REPLY
        )
        if not decision.allowed:
            svc.refuse(route.name, decision)
            await _refuse_request(svc, route, conn, msg, Reason.NOT_AUTHORIZED, is_request,
                                  send_report=False)
            return
    try:
        payload, fmt, enc, ccsid, props = _body_of(
            md.format, md.encoding, md.coded_char_set_id, msg.body
        )
    except WireError as exc:
        svc.summarised.log(
            logging.WARNING, f"unparsable request {route.name}",
            "service route %s: request body does not parse: %s (dead-lettered)",
            route.name, exc,
        )
        await _refuse_request(svc, route, conn, msg, exc.reason, is_request)
        return
    properties = dict(props)
    properties["mq.msg.id"] = md.msg_id.hex()
    properties["mq.reply.to.q"] = md.reply_to_q.strip()
    properties["mq.reply.to.q.mgr"] = md.reply_to_q_mgr.strip()
    env = Envelope(
        stream="",
        topic=route.target,
        payload=payload,
        payload_format=fmt.strip() or "",
        encoding=enc,
        ccsid=ccsid if ccsid > 0 else 1208,
        properties=properties,
        persistent=md.persistence == Persistence.PERSISTENT,
        expiry=md.expiry if md.expiry > 0 else -1,
        msg_id=md.msg_id,
        correl_id=md.correl_id,
        reply_topic=route.replies if is_request else "",
        correlation_data=token if is_request else b"",
    )
    if is_request and existing is None:
        svc.store.add_service(_service_entry(route, md, now, produced=False))
    try:
        await svc.produce(route.plugin, [env])
    except DeliveryRefusedError as exc:
        await _refuse_request(svc, route, conn, msg, exc.reason, is_request)
        return
    if is_request:
        svc.store.mark_service_produced(token)
    await conn.commit()
    svc.count(route.name, "service_requests")


def _service_entry(
    route: ServiceRoute, md: MQMD, now: float, *, produced: bool
) -> PendingService:
    expiry_at = now + md.expiry / 10 if md.expiry > 0 else None
    deadline = now + route.timeout
    if expiry_at is not None:
        deadline = min(deadline, expiry_at)
    return PendingService(
        token=md.msg_id,
        route=route.name,
        msg_id=md.msg_id,
        correl_id=md.correl_id,
        reply_to_q=md.reply_to_q.strip(),
        reply_to_q_mgr=md.reply_to_q_mgr.strip(),
        report=md.report,
        persistence=md.persistence,
        priority=md.priority,
        expiry_at=expiry_at,
        deadline=deadline,
        produced=produced,
    )


async def _refuse_request(
    svc: RequestReplyService,
    route: ServiceRoute,
    conn: Connection,
    msg: Message,
    reason: int,
    is_request: bool,
    *,
    send_report: bool = True,
) -> None:
    """A service request that cannot be forwarded for good: to the DLQ with ``reason``,
    plus an exception report (Feedback = ``reason``) when the request asked for one and
    ``send_report`` (not when its ReplyToQ itself was refused); its entry finishes
    "refused". One MQ unit of work."""
    md = msg.md
    await svc.dead_letter(conn, md, msg.body, reason, route.queue, "")
    if send_report and is_request and wants_report(md.report, reason):
        entry = _service_entry(route, md, svc.clock(), produced=False)
        report = report_md(entry, reason, now=svc.clock())
        try:
            await svc.put_or_dead_letter(  # commits the dead-lettering with it
                conn, route.name, entry.reply_to_q, entry.reply_to_q_mgr, report, b""
            )
        except DeadLetterRefusedError as exc:
            svc.summarised.log(
                logging.ERROR, f"report lost {route.name}",
                "service route %s: exception report lost: %s", route.name, exc,
            )
            await conn.commit()
    else:
        await conn.commit()
    if is_request:
        svc.store.finish_service(md.msg_id, "refused", svc.clock())
    svc.count(route.name, "service_requests_refused")


# ------------------------------------------------------------------- sweeper ---------


async def sweep(svc: RequestReplyService) -> None:
    """Every ``sweep_interval``: time out due entries, then purge old finished ones."""
    while svc.running:
        await asyncio.sleep(svc.config.sweep_interval)
        await sweep_once(svc)
        svc.task_ok(TASK_SWEEPER)


async def sweep_once(svc: RequestReplyService) -> None:
    """Each due entry on its own: one that cannot be finished now (its plugin down, its
    reply topic or ReplyToQ refusing) is tried again after a backoff -- given up only
    once its destination has refused it for ``undeliverable_after`` seconds
    (:func:`_cannot_finish`) --, while the others go on. Every due
    entry is looked at, in batches of :data:`SWEEP_BATCH`: an entry tried is finished
    or postponed past ``now``, so the next batch holds other entries."""
    now = svc.clock()
    conn: Connection | None = None
    try:
        for _ in range(MAX_SWEEP_BATCHES):
            due = svc.store.due(now, SWEEP_BATCH)
            for entry in due:
                try:
                    if isinstance(entry, PendingRequest):
                        await _time_out_request(svc, entry)
                    else:
                        if conn is None:
                            conn = await svc.qm.connect()
                        await _time_out_service(svc, conn, entry)
                except (MQError, PluginError) as exc:
                    if isinstance(exc, MQError) and conn is not None:
                        with contextlib.suppress(MQError):
                            await conn.disconnect()
                        conn = None
                    conn = await _cannot_finish(svc, conn, entry, exc)
            if len(due) < SWEEP_BATCH:
                break
    finally:
        if conn is not None:
            with contextlib.suppress(MQError):
                await conn.disconnect()
    svc.store.purge(now, svc.config.retention)


#: Entries the sweeper reads from the store at a time, and most batches of one sweep
#: (a bound on one sweep's work; what is left waits for the next sweep).
SWEEP_BATCH = 100
MAX_SWEEP_BATCHES = 50
#: Longest pause (seconds) between two tries of an entry the sweeper cannot finish.
RETRY_MAX = 30.0


def retry_delay(sweep_interval: float, attempts: int) -> float:
    """Pause before the next try of an entry tried ``attempts`` times before this failed
    one: the sweep interval doubled per try, at most :data:`RETRY_MAX`."""
    return min(RETRY_MAX, sweep_interval * 2.0 ** min(attempts + 1, 32))


def belongs_to_destination(exc: MQError | PluginError) -> bool:
    """Is ``exc`` about the entry's destination -- its reply topic or ReplyToQ refusing
    -- rather than an outage of the plugin or the queue manager? Only such failures
    count toward ``undeliverable_after``: an outsider names the destination, so a
    refusal must not keep the entry for ever, while an outage is the gateway's own and
    ends. About the destination: a refusal of the envelope (DeliveryRefusedError), a
    ReplyToQ full or put-inhibited (DestinationBusyError), and any PluginError the
    plugin does not call retriable. An outage: a retriable PluginError (the plugin or
    its broker down, the queue manager unavailable or at its disk watermark, the
    dead-letter queue full) and an MQError of the gateway's own connection (connect,
    commit)."""
    if isinstance(exc, (DeliveryRefusedError, DestinationBusyError)):
        return True
    if isinstance(exc, PluginError):
        return not exc.retriable
    return False


async def _cannot_finish(
    svc: RequestReplyService,
    conn: Connection | None,
    entry: PendingRequest | PendingService,
    exc: MQError | PluginError,
) -> Connection | None:
    """The error reply or report of ``entry`` failed: try again after a backoff, or,
    once its destination has refused it for ``undeliverable_after`` seconds
    (:func:`belongs_to_destination`), give it up. Outages are retried without a limit,
    each entry on its own backoff. The connection to use from here (None: connect
    again)."""
    now = svc.clock()
    attempts = entry.attempts + 1
    refused = belongs_to_destination(exc)
    refused_since = entry.refused_since if entry.refused_since is not None else now
    bound = svc.config.undeliverable_after
    if not refused or now - refused_since < bound:
        delay = retry_delay(svc.config.sweep_interval, entry.attempts)
        refused_at = now if refused else None
        if isinstance(entry, PendingRequest):
            svc.store.postpone_request(entry.key, now + delay, refused_at)
        else:
            svc.store.postpone_service(entry.token, now + delay, refused_at)
        until = (f"for at most {bound:.0f} s after its destination first refused" if refused
                 else "until the outage ends")
        svc.summarised.log(
            logging.WARNING, f"sweep retry {entry.route}",
            "request/reply sweep: route %s: %s (attempt %d; trying again in %.1f s, %s)",
            entry.route, exc, attempts, delay, until,
        )
        return conn
    if isinstance(entry, PendingRequest):
        async with svc.entry_lock(entry.key):
            finished = svc.store.finish_request(entry.key, UNDELIVERABLE, now)
    else:
        conn = await _dead_letter_report(svc, conn, entry, exc)
        finished = svc.store.finish_service(entry.token, UNDELIVERABLE, svc.clock())
    if not finished:
        return conn  # answered meanwhile
    svc.count(entry.route, "timeouts")
    svc.count(entry.route, UNDELIVERABLE)
    what = "error reply" if isinstance(entry, PendingRequest) else "expiration report"
    svc.summarised.log(
        logging.WARNING, f"undeliverable {entry.route}",
        "request/reply sweep: route %s: the %s of an entry could not be sent in %d "
        "attempts; its destination refused it for %.0f s (last: %s): given up as "
        "undeliverable",
        entry.route, what, attempts, now - refused_since, exc,
    )
    return conn


async def _dead_letter_report(
    svc: RequestReplyService,
    conn: Connection | None,
    entry: PendingService,
    exc: MQError | PluginError,
) -> Connection | None:
    """An expiration report that could not be put to its ReplyToQ for
    ``undeliverable_after`` seconds goes to the dead-letter queue, behind an MQDLH with
    the last MQ reason, naming the ReplyToQ: nothing the requester asked for is dropped
    while the queue manager takes it. When the DLQ cannot take it either, it is counted
    ``reports_lost``."""
    if not wants_report(entry.report, Feedback.EXPIRATION):
        return conn
    md = report_md(entry, int(Feedback.EXPIRATION), now=svc.clock())
    cause = exc if isinstance(exc, MQError) else exc.__cause__
    reason = cause.reason if isinstance(cause, MQError) else int(Reason.UNEXPECTED_ERROR)
    try:
        if conn is None:
            conn = await svc.qm.connect()
        await svc.dead_letter(conn, md, b"", reason, entry.reply_to_q, entry.reply_to_q_mgr)
        await conn.commit()
    except (MQError, PluginError) as dlq_exc:
        if conn is not None:
            with contextlib.suppress(MQError):
                await conn.backout()
        svc.summarised.log(
            logging.ERROR, f"report lost {entry.route}",
            "route %s: expiration report lost: %s", entry.route, dlq_exc,
        )
        svc.count(entry.route, "reports_lost")
        if isinstance(dlq_exc, MQError) and conn is not None:
            with contextlib.suppress(MQError):
                await conn.disconnect()
            conn = None
    return conn


async def _time_out_request(svc: RequestReplyService, entry: PendingRequest) -> None:
    async with svc.entry_lock(entry.key):
        current = svc.store.request(entry.key)
        if current is None or current.state is not State.OPEN:
            return  # answered meanwhile: only the one that finishes it produces
        route = svc.requests.get(entry.route)
        delivered = True
        if route is not None:
            delivered = await svc.error_reply_or_give_up(
                route, entry, error_envelope(entry, "timeout", text="no reply in time")
            )
        svc.store.finish_request(entry.key, "timeout", svc.clock())
    svc.count(entry.route, "timeouts")
    if delivered:
        svc.count(entry.route, "error_replies.timeout")


async def _time_out_service(
    svc: RequestReplyService, conn: Connection, entry: PendingService
) -> None:
    if wants_report(entry.report, Feedback.EXPIRATION):
        md = report_md(entry, int(Feedback.EXPIRATION), now=svc.clock())
        try:
            await svc.put_or_dead_letter(
                conn, entry.route, entry.reply_to_q, entry.reply_to_q_mgr, md, b""
            )
        except DeadLetterRefusedError as exc:
            svc.summarised.log(
                logging.ERROR, f"report lost {entry.route}",
                "route %s: expiration report lost: %s", entry.route, exc,
            )
            svc.count(entry.route, "reports_lost")
    svc.store.finish_service(entry.token, "timeout", svc.clock())
    svc.count(entry.route, "timeouts")
