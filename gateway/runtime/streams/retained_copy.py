"""Copying a legacy broker's retained publications during ``mqgw migrate``, with
documented commands only: per stream, a Register Subscriber (MQRFH) on topic ``*`` with
``InformIfRet`` put to the broker's ``SYSTEM.BROKER.CONTROL.QUEUE`` (subscriber queue
and reply queue: ``SYSTEM.MQGW.MIGRATION`` on our queue manager), the retained
publications it sends at registration (``MQPSPubOpts IsRetainedPub``) re-published as
retained (``RetainPub``) on our stream queue, then a Deregister Subscriber.

The commands carry an expiry, so a RegSub stuck on a transmission queue towards an
unreachable broker does not register a subscription there hours later. Getting the
copies from the migration queue and putting them on the stream queues is one unit of
work per stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field

from gateway.mq.port import Connection, GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.wire.constants import MsgType
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_RF_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh

__all__ = ["MIGRATION_QUEUE", "RetainedCopyResult", "copy_retained"]

MIGRATION_QUEUE = "SYSTEM.MQGW.MIGRATION"


@dataclass(slots=True)
class RetainedCopyResult:
    """Per stream: publications copied, or why the broker could not be asked."""

    copied: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _command(command: str, stream: str, own_q_mgr: str, expiry_s: float) -> tuple[MQMD, bytes]:
    pairs = [
        ("MQPSCommand", command),
        ("MQPSStreamName", stream),
        ("MQPSTopic", "*"),
        ("MQPSQMgrName", own_q_mgr),
        ("MQPSQName", MIGRATION_QUEUE),
    ]
    if command == "RegSub":
        pairs.append(("MQPSRegOpts", "InformIfRet"))
    md = MQMD(
        format=FMT_RF_HEADER,
        msg_type=MsgType.REQUEST,
        reply_to_q=MIGRATION_QUEUE,
        reply_to_q_mgr=own_q_mgr,
        msg_id=os.urandom(24),
        persistence=0,
        expiry=max(1, int(expiry_s * 10)),
        coded_char_set_id=1208,
    )
    return md, encode_rfh(MQRFH(name_values=pairs), ccsid=1208)


async def _ask(
    conn: Connection, broker: str, command: str, stream: str, timeout: float
) -> tuple[str | None, list[tuple[MQMD, MQRFH, bytes]]]:
    """Send ``command``; (error or None, publications received until the response
    plus a short quiet period)."""
    md, body = _command(command, stream, conn.q_mgr_name, timeout * 2)
    out = await conn.open(CONTROL_QUEUE, OpenOption.OUTPUT, broker)
    try:
        await out.put(md, body, PutOptions())
    finally:
        await out.close()
    inq = await conn.open(MIGRATION_QUEUE, OpenOption.INPUT_SHARED)
    pubs: list[tuple[MQMD, MQRFH, bytes]] = []
    answered: str | None = "no response"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            wait = deadline - loop.time()
            if answered is None:
                wait = 0.5  # the response came: the publications sent with it follow
            if wait <= 0:
                break
            try:
                msg = await inq.get(GetOptions(wait_ms=int(wait * 1000), syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            try:
                rfh, used = decode_rfh(msg.body, msg.md.encoding, ccsid=msg.md.coded_char_set_id)
            except WireError:
                continue  # not ours: consumed with the unit of work, like any stray
            if rfh.get("MQPSCommand") == "Publish":
                pubs.append((msg.md, rfh, msg.body[used:]))
            elif msg.md.correl_id == md.msg_id:
                comp = rfh.get("MQPSCompCode", "")
                answered = (
                    None
                    if comp in ("0", "1")
                    else (f"{command} refused: CompCode {comp}, Reason {rfh.get('MQPSReason')}")
                )
                if answered is not None:
                    break
    finally:
        await inq.close()
    if answered == "no response":
        answered = f"broker {broker} did not answer {command} within {timeout:g} s"
    return answered, pubs


async def copy_retained(
    conn: Connection, broker: str, streams: list[str], *, timeout: float = 10.0
) -> RetainedCopyResult:
    """Copy ``broker``'s retained publications on ``streams`` to our stream queues
    (which must exist; the migration queue must exist too)."""
    result = RetainedCopyResult()
    for stream in streams:
        try:
            error, pubs = await _ask(conn, broker, "RegSub", stream, timeout)
            if error is not None:
                await conn.backout()
                result.failed[stream] = error
                continue
            target = await conn.open(stream, OpenOption.OUTPUT)
            try:
                for md, rfh, payload in pubs:
                    topic = rfh.get("MQPSTopic") or ""
                    pairs = [
                        ("MQPSCommand", "Publish"),
                        ("MQPSStreamName", stream),
                        ("MQPSTopic", topic),
                        ("MQPSPubOpts", "RetainPub"),
                    ]
                    if rfh.get("MQPSPubTime"):
                        pairs.append(("MQPSPubTime", rfh.get("MQPSPubTime") or ""))
                    head = MQRFH(
                        name_values=pairs,
                        format=rfh.format,
                        encoding=rfh.encoding,
                        coded_char_set_id=rfh.coded_char_set_id,
                    )
                    copy = MQMD(
                        format=FMT_RF_HEADER,
                        msg_type=MsgType.DATAGRAM,
                        persistence=md.persistence,
                        coded_char_set_id=1208,
                    )
                    await target.put(
                        copy, encode_rfh(head, ccsid=1208) + payload, PutOptions(syncpoint=True)
                    )
            finally:
                await target.close()
            await conn.commit()
            result.copied[stream] = len(pubs)
            error, _ = await _ask(conn, broker, "DeregSub", stream, timeout)
            await conn.commit()
            if error is not None:
                result.failed[stream] = f"copied, but the DeregSub failed: {error}"
        except MQError as exc:
            with contextlib.suppress(MQError):
                await conn.backout()
            result.failed[stream] = str(exc)
    return result
