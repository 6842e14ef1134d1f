"""The one exception type of the wire layer.

Why it carries a reason code: a header the gateway cannot decode ends up in an MQDLH
(Reason field) or a pub/sub error response (MQPSReason / <Reason>), so the fault must be
expressed the way IBM MQ would report it, plus a byte offset for humans and fuzz triage.
"""

from __future__ import annotations

from gateway.wire.reasons import Reason


class WireError(Exception):
    """A structure could not be decoded or encoded.

    ``reason`` is the MQ reason code MQ would report (e.g. ``Reason.RFH_ERROR``),
    ``offset`` the byte offset in the input where the fault was found (``-1`` if it is
    not tied to a position, e.g. when encoding).
    """

    def __init__(self, reason: int, message: str, offset: int = -1) -> None:
        self.reason: int = int(reason)
        self.message = message
        self.offset = offset
        where = f" at offset {offset}" if offset >= 0 else ""
        try:
            name = Reason(self.reason).ibm_name
        except ValueError:
            name = f"reason {self.reason}"
        super().__init__(f"{name}: {message}{where}")

    def __reduce__(self) -> tuple[type[WireError], tuple[int, str, int]]:
        return (type(self), (self.reason, self.message, self.offset))
