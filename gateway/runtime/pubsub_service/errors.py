"""Errors of the publish/subscribe service, and which MQ reasons mean "reconnect"."""

from __future__ import annotations

from gateway.mq.port import MQError
from gateway.runtime.errors import GatewayRuntimeError
from gateway.wire.reasons import Reason

__all__ = [
    "CONNECTION_REASONS",
    "AsideQueueError",
    "BacklogFullError",
    "BrokerError",
]

#: Reasons after which retrying the batch on this connection is pointless: reconnect.
CONNECTION_REASONS = frozenset(
    {
        Reason.CONNECTION_BROKEN,
        Reason.Q_MGR_STOPPING,
        Reason.Q_MGR_NOT_AVAILABLE,
        Reason.HCONN_ERROR,
    }
)


class BrokerError(GatewayRuntimeError):
    """The publish/subscribe service cannot run (a serviced queue is missing, ...)."""

    def __init__(self, message: str, reason: int = 0) -> None:
        super().__init__(message)
        self.reason = reason


class BacklogFullError(BrokerError):
    """A sink's backlog queue is full (MQRC 2053) or has no space (2056), or the queue
    manager has no space for a delivery (2056, its disk at the free-space watermark):
    the batch backs out (back-pressure, not counted against BOTHRESH) and its stream
    waits until the sink catches up (``dead_letter._holds_back``)."""

    def __init__(self, queue: str, exc: MQError) -> None:
        what = "is full" if exc.reason == Reason.Q_FULL else f"has no space ({exc.detail})"
        super().__init__(f"queue {queue} {what}: batch backed out", exc.reason)
        self.queue = queue


class AsideQueueError(BrokerError):
    """A put to the dead-letter queue or a backout queue failed: the batch backs out."""

    def __init__(self, queue: str, exc: MQError) -> None:
        super().__init__(f"put to {queue} failed: {exc}", exc.reason)
        self.queue = queue
