"""Copying a legacy broker's retained publications during ``mqgw migrate``, with
documented commands only (:mod:`gateway.runtime.streams.broker_query`): per stream, a
Register Subscriber (MQRFH) on topic ``*`` with ``InformIfRet``, the retained
publications it sends at registration (``MQPSPubOpts IsRetainedPub``) re-published as
retained (``RetainPub``) on our stream queue, then a Deregister Subscriber.

Getting the copies from the migration queue and putting them on the stream queues is one
unit of work per stream.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from gateway.mq.port import Connection, MQError, OpenOption, PutOptions
from gateway.runtime.streams.broker_query import MIGRATION_QUEUE, ask_broker
from gateway.wire.constants import MsgType
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_RF_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh

__all__ = ["MIGRATION_QUEUE", "RetainedCopyResult", "copy_retained"]


@dataclass(slots=True)
class RetainedCopyResult:
    """Per stream: publications copied, or why the broker could not be asked."""

    copied: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


async def _ask(
    conn: Connection, broker: str, command: str, stream: str, timeout: float
) -> tuple[str | None, list[tuple[MQMD, MQRFH, bytes]]]:
    """Send ``command`` on topic ``*``; (error or None, the MQRFH Publish commands
    received with the answer). Anything else on the migration queue is consumed with
    the unit of work, like any stray."""
    answer = await ask_broker(conn, broker, command, stream, "*", timeout)
    pubs: list[tuple[MQMD, MQRFH, bytes]] = []
    for msg in answer.messages:
        try:
            rfh, used = decode_rfh(msg.body, msg.md.encoding, ccsid=msg.md.coded_char_set_id)
        except WireError:
            continue
        if rfh.get("MQPSCommand") == "Publish":
            pubs.append((msg.md, rfh, msg.body[used:]))
    return answer.error, pubs


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
