"""The MQ-side loops of the request/reply service: the reply-queue reader, one reader per
service queue, and the timeout sweeper (docs/request-reply.md, once/in-order table).

Each loop owns its connection (an MQ connection owns one unit of work) and reconnects
with backoff when the queue manager is unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.mq.port import (
    Connection,
    GetOptions,
    Message,
    MQError,
    OpenOption,
    QueueHandle,
)
from gateway.plugin_api import DeliveryRefusedError, Envelope, PluginError
from gateway.routing.addressing import (
    classify,
    error_envelope,
    reply_envelope,
    report_md,
    wants_report,
)
from gateway.routing.correlation import PendingRequest, PendingService, State
from gateway.routing.routes import ServiceRoute
from gateway.runtime.envelopes import usr_properties
from gateway.wire.constants import Feedback, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.folder import serialize_folder
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.rfh2 import decode_rfh2

if TYPE_CHECKING:
    from gateway.runtime.request_reply.service import RequestReplyService

log = logging.getLogger(__name__)

#: MQFB_APPL_FIRST + 1: the MQDLH reason of a reply no pending request waits for.
NO_PENDING_REQUEST = 65537
_NO_MSG = 2033
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
) -> None:
    """Get each message of ``queue`` under syncpoint and hand it to ``handle_one``,
    which commits; a retriable failure backs out and retries with backoff."""
    delay = 0.1
    while svc.running:
        try:
            conn, handle = await _open(svc, queue)
        except MQError as exc:
            log.warning("%s: cannot open %s: %s (retrying)", what, queue, exc)
            await asyncio.sleep(delay)
            delay = min(_MAX_BACKOFF, delay * 2)
            continue
        try:
            while svc.running:
                try:
                    msg = await handle.get(GetOptions(wait_ms=svc.wait_ms, syncpoint=True))
                except MQError as exc:
                    if exc.reason == _NO_MSG:
                        continue
                    raise
                try:
                    await handle_one(conn, msg)
                    delay = 0.1
                except PluginError as exc:
                    with contextlib.suppress(MQError):
                        await conn.backout()
                    log.warning("%s: %s (message kept, retrying)", what, exc)
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


# ------------------------------------------------------------------- replies ---------


async def read_replies(svc: RequestReplyService) -> None:
    async def one(conn: Connection, msg: Message) -> None:
        await handle_reply(svc, conn, msg)

    await _serve(svc, svc.config.reply_queue, "reply queue", one)


async def handle_reply(svc: RequestReplyService, conn: Connection, msg: Message) -> None:
    """Reply → requester: produce → finish_request → MQ commit."""
    md = msg.md
    kind = classify(md)
    pending = svc.store.request(md.correl_id)
    route = svc.requests.get(pending.route) if pending is not None else None
    reply_queue = svc.config.reply_queue
    if pending is None or route is None:
        log.info("reply queue: message with CorrelId %s matches no request", md.correl_id.hex())
        await svc.dead_letter(conn, md, msg.body, NO_PENDING_REQUEST, reply_queue, "")
        await conn.commit()
        svc.count(pending.route if pending else "", "replies_unmatched")
        return
    if pending.state is State.DONE:
        if pending.outcome == "timeout":
            await svc.dead_letter(conn, md, msg.body, NO_PENDING_REQUEST, reply_queue, "")
            svc.count(route.name, "replies_late")
        else:
            svc.count(route.name, "duplicates_filtered")
        await conn.commit()
        return
    if kind.kind == "reply":
        env = reply_envelope(pending, md, msg.body)
    else:
        env = error_envelope(pending, kind.kind, feedback=kind.feedback)
    try:
        await svc.produce(route.plugin, [env])
    except DeliveryRefusedError as exc:
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

    await _serve(svc, route.queue, f"service route {route.name}", one)


def _body_of(md_format: str, encoding: int, ccsid: int, body: bytes) -> tuple[
    bytes, str, int, int, list[tuple[str, str]]
]:
    """(payload, its format, encoding, CCSID, usr properties): an MQRFH2 stripped."""
    if md_format.strip() != FMT_RF_HEADER_2.strip():
        return body, md_format, encoding, ccsid, []
    rfh2, length = decode_rfh2(body, encoding, ccsid=ccsid)
    folders = [serialize_folder(f) for f in rfh2.folders]
    props, _ = usr_properties(folders)
    return body[length:], rfh2.format, rfh2.encoding, rfh2.coded_char_set_id, props


async def handle_service_request(
    svc: RequestReplyService, route: ServiceRoute, conn: Connection, msg: Message
) -> None:
    """MQ request → responder: produce → add_service → MQ commit."""
    md = msg.md
    now = svc.clock()
    is_request = md.msg_type == MsgType.REQUEST and bool(md.reply_to_q.strip())
    token = md.msg_id
    if is_request and svc.store.service(token) is not None:
        await conn.commit()
        svc.count(route.name, "duplicates_filtered")
        return
    try:
        payload, fmt, enc, ccsid, props = _body_of(
            md.format, md.encoding, md.coded_char_set_id, msg.body
        )
    except WireError as exc:
        log.warning("service route %s: request body does not parse: %s", route.name, exc)
        await svc.dead_letter(conn, md, msg.body, exc.reason, route.queue, "")
        await conn.commit()
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
    try:
        await svc.produce(route.plugin, [env])
    except DeliveryRefusedError as exc:
        await svc.dead_letter(conn, md, msg.body, exc.reason, route.queue, "")
        await conn.commit()
        svc.count(route.name, "service_requests_refused")
        return
    if is_request:
        expiry_at = now + md.expiry / 10 if md.expiry > 0 else None
        deadline = now + route.timeout
        if expiry_at is not None:
            deadline = min(deadline, expiry_at)
        svc.store.add_service(
            PendingService(
                token=token,
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
            )
        )
    await conn.commit()
    svc.count(route.name, "service_requests")


# ------------------------------------------------------------------- sweeper ---------


async def sweep(svc: RequestReplyService) -> None:
    """Every ``sweep_interval``: time out due entries, then purge old finished ones."""
    while svc.running:
        await asyncio.sleep(svc.config.sweep_interval)
        try:
            await sweep_once(svc)
        except (MQError, PluginError) as exc:
            log.warning("request/reply sweep: %s (retrying next sweep)", exc)


async def sweep_once(svc: RequestReplyService) -> None:
    now = svc.clock()
    due = svc.store.due(now)
    if due:
        conn = await svc.qm.connect()
        try:
            for entry in due:
                if isinstance(entry, PendingRequest):
                    await _time_out_request(svc, entry)
                else:
                    await _time_out_service(svc, conn, entry)
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()
    svc.store.purge(now, svc.config.retention)


async def _time_out_request(svc: RequestReplyService, entry: PendingRequest) -> None:
    route = svc.requests.get(entry.route)
    if route is not None:
        await svc.produce(route.plugin, [error_envelope(entry, "timeout", text="no reply in time")])
    svc.store.finish_request(entry.key, "timeout", svc.clock())
    svc.count(entry.route, "timeouts")
    svc.count(entry.route, "error_replies.timeout")


async def _time_out_service(
    svc: RequestReplyService, conn: Connection, entry: PendingService
) -> None:
    if wants_report(entry.report, Feedback.EXPIRATION):
        md = report_md(entry, int(Feedback.EXPIRATION), now=svc.clock())
        await svc.put_or_dead_letter(
            conn, entry.route, entry.reply_to_q, entry.reply_to_q_mgr, md, b""
        )
    svc.store.finish_service(entry.token, "timeout", svc.clock())
    svc.count(entry.route, "timeouts")
