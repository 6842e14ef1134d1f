"""Asking a legacy broker something during ``mqgw migrate``, with documented commands
only: a Register/Deregister Subscriber (MQRFH) put to the broker's
``SYSTEM.BROKER.CONTROL.QUEUE``, subscriber queue and reply queue ``SYSTEM.MQGW.MIGRATION``
on our queue manager (not the inter-broker queue: a stopped gateway's pending traffic
there must stay for it), and what arrives on that queue until the broker answers.

The commands carry an expiry, so a RegSub stuck on a transmission queue towards an
unreachable broker does not register a subscription there hours later. The caller reads
the migration queue under syncpoint and commits or backs out (one unit of work).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from gateway.mq.port import Connection, GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.wire.constants import MsgType
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_RF_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh

__all__ = ["MIGRATION_QUEUE", "BrokerAnswer", "ask_broker", "send_command"]

MIGRATION_QUEUE = "SYSTEM.MQGW.MIGRATION"
#: After the response, the publications sent with it follow; stop after this much quiet.
_QUIET_S = 0.5


@dataclass(slots=True)
class BrokerAnswer:
    """``error`` is None when the broker accepted the command; ``messages`` are the
    other messages that arrived meanwhile (publications: the caller decodes them)."""

    error: str | None
    messages: list[Message]
    #: False when nothing at all came back within the timeout (the route is suspect)
    answered: bool


def _command(
    command: str, stream: str, topic: str, own_q_mgr: str, expiry_s: float
) -> tuple[MQMD, bytes]:
    pairs = [
        ("MQPSCommand", command),
        ("MQPSStreamName", stream),
        ("MQPSTopic", topic),
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


def _response(msg: Message, request_id: bytes) -> MQRFH | None:
    """The broker's MQRFH response to our request, or None for anything else."""
    if msg.md.correl_id != request_id or msg.md.format != FMT_RF_HEADER:
        return None
    try:
        rfh, _ = decode_rfh(msg.body, msg.md.encoding, ccsid=msg.md.coded_char_set_id)
    except WireError:
        return None
    return rfh if rfh.get("MQPSCompCode") is not None else None


async def send_command(
    conn: Connection, broker: str, command: str, stream: str, topic: str, expiry_s: float
) -> bytes:
    """Put ``command`` to ``broker``'s control queue (expiring after ``expiry_s``); its
    MsgId, which the broker's response carries as CorrelId."""
    md, body = _command(command, stream, topic, conn.q_mgr_name, expiry_s)
    out = await conn.open(CONTROL_QUEUE, OpenOption.OUTPUT, broker)
    try:
        await out.put(md, body, PutOptions())
    finally:
        await out.close()
    return md.msg_id


async def ask_broker(
    conn: Connection, broker: str, command: str, stream: str, topic: str, timeout: float
) -> BrokerAnswer:
    """Send ``command`` (RegSub with InformIfRet, or DeregSub) for ``topic`` (a
    character-scheme pattern) of ``stream`` to ``broker``; collect what arrives on the
    migration queue (gets under syncpoint) until its response plus a quiet period, or
    ``timeout`` seconds."""
    request_id = await send_command(conn, broker, command, stream, topic, timeout * 2)
    inq = await conn.open(MIGRATION_QUEUE, OpenOption.INPUT_SHARED)
    messages: list[Message] = []
    error: str | None = f"broker {broker} did not answer {command} within {timeout:g} s"
    responded = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            wait = _QUIET_S if responded else deadline - loop.time()
            if wait <= 0:
                break
            try:
                msg = await inq.get(GetOptions(wait_ms=int(wait * 1000), syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            rfh = _response(msg, request_id)
            if rfh is None:
                messages.append(msg)
                continue
            responded = True
            comp = rfh.get("MQPSCompCode", "")
            if comp in ("0", "1"):
                error = None
            else:
                error = f"{command} refused: CompCode {comp}, Reason {rfh.get('MQPSReason')}"
                break
    finally:
        await inq.close()
    return BrokerAnswer(error, messages, answered=responded or bool(messages))
