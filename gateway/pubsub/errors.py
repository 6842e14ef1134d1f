"""The one exception root of the publish/subscribe layer.

Why it carries a reason code and a parameter name: a command the engine refuses is
answered the way an MQ broker answers it (MQRFH ``MQPSReason``/``MQPSParmId``, or a
``pscr`` ``<Response>``), and a malformed command is dead-lettered with that reason in
its MQDLH (reference §5.6, §5.10).
"""

from __future__ import annotations

from gateway.wire.folder import Element
from gateway.wire.reasons import reason_text


class PubSubError(Exception):
    """Root of every error raised by ``gateway.pubsub``."""

    def __init__(self, reason: int, message: str = "") -> None:
        self.reason = int(reason)
        self.message = message
        super().__init__(f"{reason_text(self.reason)}: {message}".rstrip(": "))


class CommandError(PubSubError):
    """A command message is malformed or uses the protocol wrongly.

    ``parm_id`` names the offending tag/element (``MQPSTopic``, ``RegOpt``...) when one
    is to blame; ``value`` is the offending value, echoed in the response; ``error_pos``
    is the character offset in an MQRFH NameValueString when known;
    ``dead_letter_reason`` is the MQDLH reason when it is not ``reason`` (0: the same).
    """

    def __init__(
        self,
        reason: int,
        message: str = "",
        *,
        parm_id: str = "",
        value: str = "",
        error_pos: int = -1,
        dead_letter_reason: int = 0,
    ) -> None:
        super().__init__(reason, message)
        self.parm_id = parm_id
        self.value = value
        self.error_pos = error_pos
        self.dead_letter_reason = int(dead_letter_reason) or self.reason
        #: The command's ``psc`` folder when it was readable (returned in the ``pscr``).
        self.psc: Element | None = None
        #: The command's MQRFH name/value pairs when they were readable (appended to the
        #: MQRFH error response, reference §5.6).
        self.name_values: list[tuple[str, str]] | None = None


class StoreError(PubSubError):
    """The subscription/retained store could not be read or written."""


class CommandRefusedError(PubSubError):
    """A well-formed command the broker cannot carry out (not registered, nothing
    retained, ...): answered negatively, but the message is not dead-lettered."""

    def __init__(
        self,
        reason: int,
        message: str = "",
        *,
        parm_id: str = "",
        value: str = "",
        warning: bool = False,
    ) -> None:
        super().__init__(reason, message)
        self.parm_id = parm_id
        self.value = value
        self.warning = warning
