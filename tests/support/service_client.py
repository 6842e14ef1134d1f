"""A test application of the broker: puts commands and reads subscriber queues through
the queue-manager port, as a legacy MQRFH/MQRFH2 application would."""

from __future__ import annotations

import asyncio
import time

from gateway.mq.port import GetOptions, Message, MQError, OpenOption, PutOptions, QueueManager
from gateway.pubsub.outcome import InboundMessage
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import Received, decode


async def put(qm: QueueManager, msg: InboundMessage, *, set_identity: bool = False) -> bytes:
    """Put ``msg`` as a legacy application would; ``set_identity`` keeps its
    UserIdentifier (MQPMO_SET_IDENTITY_CONTEXT) instead of the queue manager's."""
    conn = await qm.connect()
    try:
        options = PutOptions(new_msg_id=False, set_identity_context=set_identity)
        md = await conn.put1(msg.queue, msg.md, msg.body, options)
        return md.msg_id
    finally:
        await conn.disconnect()


async def put_at_once(qm: QueueManager, messages: list[InboundMessage]) -> None:
    """Put ``messages`` in one unit of work: a whole stream is there at once. Put one
    by one, a gateway keeps pace, and a stop meant to land mid-stream comes after it."""
    conn = await qm.connect()
    try:
        for m in messages:
            await conn.put1(m.queue, m.md, m.body, PutOptions(syncpoint=True))
        await conn.commit()
    finally:
        await conn.disconnect()


async def drain(qm: QueueManager, queue: str) -> list[Received]:
    """Every message now on ``queue``, decoded (destructive get)."""
    return [decode(m.md, m.body) for m in await drain_raw(qm, queue)]


async def drain_raw(qm: QueueManager, queue: str) -> list[Message]:
    """Every message now on ``queue`` (destructive get)."""
    conn = await qm.connect()
    out: list[Message] = []
    try:
        handle = await conn.open(queue, OpenOption.INPUT_SHARED)
        while True:
            try:
                m = await handle.get(GetOptions(wait_ms=0))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            out.append(m)
        await handle.close()
    finally:
        await conn.disconnect()
    return out


async def settle(
    qm: QueueManager, service: BrokerService, *queues: str, timeout: float = 10
) -> None:
    """Wait until the serviced input queues are empty and the service has been idle
    (no batch in progress, no message handled) for three checks in a row."""
    deadline = time.monotonic() + timeout
    names = queues or tuple(q for q, _ in service.serviced_queues)
    idle, seen = 0, -1
    while time.monotonic() < deadline:
        busy = any(qm.queue_depth(n) for n in names) or service.busy  # type: ignore[attr-defined]
        handled = service.counters.messages + service.counters.backouts
        idle = idle + 1 if not busy and handled == seen else 0
        seen = handled
        if idle >= 3:
            return
        await asyncio.sleep(0.03)
    raise AssertionError(f"queues {names} not drained within {timeout}s")


async def wait_for_queue(
    qm: QueueManager, queue: str, count: int, timeout: float = 20
) -> list[Received]:
    """Get ``count`` messages from ``queue`` (destructively), waiting up to ``timeout``."""
    got: list[Received] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            got.extend(await drain(qm, queue))
            if len(got) < count:
                await asyncio.sleep(0.05)
    return got
