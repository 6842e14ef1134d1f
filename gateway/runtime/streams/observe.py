"""Looking at the queue manager for ``mqgw streams check`` and /healthz: does each stream
queue exist, its depth and oldest message, and which dead-letter messages are a
neighbour's publications that found no stream queue (MQDLH reason 2085, DestQName a
stream of the union). Uses only the MQ port (open/inquire/browse), so it works on the
embedded queue manager and on IBM MQ alike; never gets a message.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from gateway.mq.port import Browse, Connection, GetOptions, MQError, OpenOption, QueueAttr
from gateway.runtime.pubsub_service.dead_letter import dead_letter_queue_of
from gateway.runtime.streams.check import QueueState
from gateway.wire.dlh import MQDLH_LENGTH_1, decode_dlh
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_DEAD_LETTER_HEADER
from gateway.wire.put_time import put_time_ms
from gateway.wire.reasons import Reason

__all__ = [
    "BROWSE_LIMIT",
    "DeadLettered",
    "browse_dead_lettered",
    "dead_letter_queue",
    "observe_queue",
    "observe_streams",
]

#: Messages browsed per queue at most (the oldest is found among them; MQ browses in
#: priority then FIFO order, so the first is the oldest unless priorities differ).
BROWSE_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A dead-letter message that is a publication for a stream queue of the union."""

    msg_id: bytes
    stream: str


async def dead_letter_queue(conn: Connection, fallback: str) -> str:
    """The queue manager's DEADQ (the embedded one answers on any queue handle)."""
    try:
        h = await conn.open(fallback, OpenOption.INQUIRE)
    except MQError:
        return fallback
    try:
        name, _ = await dead_letter_queue_of(h, fallback)
        return name
    finally:
        with contextlib.suppress(MQError):
            await h.close()


async def observe_queue(conn: Connection, name: str, limit: int = BROWSE_LIMIT) -> QueueState:
    """Existence, depth and the oldest PutDate/PutTime of queue ``name``."""
    try:
        h = await conn.open(name, OpenOption.INQUIRE | OpenOption.BROWSE)
    except MQError as exc:
        if exc.reason == Reason.UNKNOWN_OBJECT_NAME:
            return QueueState(False)
        raise
    try:
        attrs = await h.inquire(QueueAttr.CURRENT_Q_DEPTH)
        depth = int(attrs.get(QueueAttr.CURRENT_Q_DEPTH, 0))
        oldest: float | None = None
        browse = Browse.FIRST
        for _ in range(min(depth, limit)):
            try:
                msg = await h.get(GetOptions(browse=browse, max_length=0, accept_truncated=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            browse = Browse.NEXT
            ms = put_time_ms(msg.md.put_date, msg.md.put_time)
            if ms is not None and (oldest is None or ms / 1000 < oldest):
                oldest = ms / 1000
        return QueueState(True, depth, oldest)
    finally:
        with contextlib.suppress(MQError):
            await h.close()


async def browse_dead_lettered(
    conn: Connection, dlq: str, streams: Collection[str], limit: int = BROWSE_LIMIT * 10
) -> list[DeadLettered]:
    """The DLQ's messages with MQDLH reason 2085 (UNKNOWN_OBJECT_NAME) whose DestQName
    is one of ``streams`` on this queue manager (DestQMgrName blank or ours)."""
    try:
        h = await conn.open(dlq, OpenOption.BROWSE)
    except MQError as exc:
        if exc.reason == Reason.UNKNOWN_OBJECT_NAME:
            return []
        raise
    out: list[DeadLettered] = []
    own = conn.q_mgr_name.strip()
    try:
        browse = Browse.FIRST
        for _ in range(limit):
            try:
                msg = await h.get(
                    GetOptions(browse=browse, max_length=MQDLH_LENGTH_1, accept_truncated=True)
                )
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            browse = Browse.NEXT
            if msg.md.format != FMT_DEAD_LETTER_HEADER:
                continue
            try:
                dlh, _ = decode_dlh(msg.body, msg.md.encoding, ccsid=msg.md.coded_char_set_id)
            except WireError:
                continue
            dest, dest_qm = dlh.dest_q_name.strip(), dlh.dest_q_mgr_name.strip()
            if (
                dlh.reason == Reason.UNKNOWN_OBJECT_NAME
                and dest in streams
                and dest_qm
                in (
                    "",
                    own,
                )
            ):
                out.append(DeadLettered(msg.md.msg_id, dest))
    finally:
        with contextlib.suppress(MQError):
            await h.close()
    return out


async def observe_streams(
    conn: Connection, streams: Collection[str], dlq: str, browse_limit: int = BROWSE_LIMIT
) -> tuple[dict[str, QueueState], dict[str, int]]:
    """Queue state per stream and count of dead-lettered publications per stream."""
    queues = {s: await observe_queue(conn, s, browse_limit) for s in streams}
    counts = Counter(d.stream for d in await browse_dead_lettered(conn, dlq, streams))
    return queues, dict(counts)
