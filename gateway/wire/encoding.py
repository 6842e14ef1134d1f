"""Integer byte order from an MQ Encoding value (MQENC_*).

Why: every MQ structure's integers are in the byte order named by the *governing*
Encoding (the caller's, the MQMD's, or the preceding header's), never the host's.
Reference: IBM MQ "Machine encodings" / MQENC_INTEGER_* (protocol reference §1.1).
"""

from __future__ import annotations

from gateway.wire.constants import ENC_INTEGER_MASK, ENC_INTEGER_NORMAL, ENC_INTEGER_REVERSED
from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

BIG = ">"
LITTLE = "<"


def byte_order(encoding: int, *, field: str = "Encoding", decoding: bool = True) -> str:
    """Return the ``struct`` byte-order prefix for ``encoding``.

    Raises WireError (MQRC_SOURCE_INTEGER_ENC_ERROR when decoding, MQRC_TARGET_INTEGER_ENC_ERROR
    when encoding) when the integer sub-field is neither 1 (normal, big-endian) nor
    2 (reversed, little-endian); ``field`` names where the value came from.
    """
    integer = encoding & ENC_INTEGER_MASK
    if integer == ENC_INTEGER_REVERSED:
        return LITTLE
    if integer == ENC_INTEGER_NORMAL:
        return BIG
    reason = Reason.SOURCE_INTEGER_ENC_ERROR if decoding else Reason.TARGET_INTEGER_ENC_ERROR
    raise WireError(
        reason,
        f"{field} {encoding} has integer encoding {integer}; expected 1 (normal) or 2 (reversed)",
    )


def is_big_endian(encoding: int) -> bool:
    """True when ``encoding`` names big-endian (MQENC_INTEGER_NORMAL) integers."""
    return byte_order(encoding) == BIG
