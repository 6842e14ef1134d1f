"""Errors of the request/reply service."""

from __future__ import annotations

from gateway.plugin_api import PluginError

__all__ = ["DeadLetterRefusedError"]


class DeadLetterRefusedError(PluginError):
    """The dead-letter queue refuses a message for good (too big for it once the MQDLH
    is added, put-inhibited for good...): not retriable. ``reason``: the MQRC."""

    def __init__(self, message: str, *, reason: int) -> None:
        super().__init__(message, retriable=False)
        self.reason = reason
