"""Whether what we put for a neighbour still waits on our transmission queue.

Why: a proxy command that has no answer yet is usually not lost: the channel to the
neighbour is down and the command waits on the transmission queue, or the neighbour
has not got to it yet. Sending it again then only adds a copy per resend (issue 29:
the queue grew by one copy of every proxy per 30 s). The links resend only when the
transmission queue towards the neighbour is empty (and the neighbour was heard from
since the last put, or the backoff reached its longest: :mod:`.resend`); when its depth
cannot be told, only when the neighbour was heard from.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gateway.mq.port import Connection, MQError, OpenOption, QueueAttr
from gateway.pubsub.streams import CONTROL_QUEUE

__all__ = ["CLUSTER_TRANSMIT_QUEUE", "transmission_depth"]

CLUSTER_TRANSMIT_QUEUE = "SYSTEM.CLUSTER.TRANSMIT.QUEUE"
#: MQUS_TRANSMISSION: the Usage of a transmission queue.
_USAGE_TRANSMISSION = 1


async def transmission_depth(qm: Any, conn: Connection, q_mgr: str) -> int | None:
    """Messages on the transmission queue that reaches ``q_mgr``; None when it cannot
    be told (no such queue of its own: a cluster, a default transmission queue on IBM
    MQ, an error). The embedded queue manager resolves the name as a put would; on IBM
    MQ the usual local queue named after the queue manager is inquired."""
    resolve = getattr(qm, "resolve", None)
    depth_of = getattr(qm, "queue_depth", None)
    if resolve is not None and depth_of is not None:
        try:
            xmitq = resolve(CONTROL_QUEUE, q_mgr).xmit_q_name
        except MQError:
            return None
        if not xmitq or xmitq == CLUSTER_TRANSMIT_QUEUE:
            return None  # local, or shared with every cluster member
        try:
            return int(depth_of(xmitq))
        except MQError:
            return None
    try:
        handle = await conn.open(q_mgr, OpenOption.INQUIRE)
    except MQError:
        return None
    try:
        attrs = await handle.inquire(QueueAttr.USAGE, QueueAttr.CURRENT_Q_DEPTH)
    except MQError:
        return None
    finally:
        with contextlib.suppress(MQError):
            await handle.close()
    if int(attrs.get(QueueAttr.USAGE, 0)) != _USAGE_TRANSMISSION:
        return None
    return int(attrs.get(QueueAttr.CURRENT_Q_DEPTH, 0))
