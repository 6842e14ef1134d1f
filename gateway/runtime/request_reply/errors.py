"""Errors of the request/reply service."""

from __future__ import annotations

from gateway.plugin_api import PluginError
from gateway.wire.reasons import Reason

__all__ = ["DESTINATION_REASONS", "DeadLetterRefusedError", "DestinationBusyError"]

#: Retriable MQ reasons of a put that are about the queue put to (or the transmission
#: queue on the way to it), not about the connection or the queue manager as a whole.
DESTINATION_REASONS = frozenset({Reason.Q_FULL, Reason.PUT_INHIBITED})


class DeadLetterRefusedError(PluginError):
    """The dead-letter queue refuses a message for good (too big for it once the MQDLH
    is added, put-inhibited for good...): not retriable. ``reason``: the MQRC."""

    def __init__(self, message: str, *, reason: int) -> None:
        super().__init__(message, retriable=False)
        self.reason = reason


class DestinationBusyError(PluginError):
    """A put to a queue named from outside (a requester's ReplyToQ) that MQ refuses for
    now for a reason of that queue (:data:`DESTINATION_REASONS`: full, put-inhibited).
    Retriable, as the queue may drain, but it belongs to that destination and not to an
    outage: the sweeper counts it toward ``undeliverable_after``. ``reason``: the MQRC."""

    def __init__(self, message: str, *, reason: int) -> None:
        super().__init__(message, retriable=True)
        self.reason = reason
