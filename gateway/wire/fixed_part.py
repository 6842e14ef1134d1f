"""How every MQ structure decoder opens: byte order, enough bytes, StrucId, Version.

Why its own module: MQDLH, MQMDE, MQXQH and the MQRFH/MQRFH2 fixed part all start with
StrucId (4 characters) and Version (MQLONG). Each decoder must refuse a short buffer,
tell the character set of the structure's text from how StrucId is spelled
(:func:`gateway.wire.ccsid.struc_id_ccsid`) and check Version, every time with the
structure's own reason code, the same wording and the same offsets. Written once here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from gateway.wire.ccsid import struc_id_ccsid
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError

__all__ = ["FixedPart"]


class FixedPart:
    """The opening of one structure: ``layouts`` maps ``"<"``/``">"`` to the struct of
    its fixed part (StrucId and Version first). ``min_length`` is what must be present
    before anything is read (the whole structure when it has a fixed size; with
    ``at_least`` the message says "at least"). ``version``, when given, is the only
    Version accepted."""

    __slots__ = (
        "ascii_id",
        "at_least",
        "ebcdic_id",
        "layouts",
        "min_length",
        "reason",
        "version",
        "what",
    )

    def __init__(
        self,
        what: str,
        reason: int,
        layouts: Mapping[str, struct.Struct],
        *,
        ascii_id: bytes,
        ebcdic_id: bytes,
        min_length: int,
        version: int | None = None,
        at_least: bool = False,
    ) -> None:
        self.what = what
        self.reason = reason
        self.layouts = layouts
        self.ascii_id = ascii_id
        self.ebcdic_id = ebcdic_id
        self.min_length = min_length
        self.version = version
        self.at_least = at_least

    def unpack(
        self, buf: bytes | bytearray | memoryview, encoding: int, ccsid: int
    ) -> tuple[tuple[Any, ...], int, str]:
        """(fields of the fixed part, CCSID of its text, byte order) at the start of
        ``buf``; ``encoding``/``ccsid`` are those of the preceding structure."""
        what = self.what
        order = byte_order(encoding, field=f"{what} governing encoding")
        if len(buf) < self.min_length:
            least = "at least " if self.at_least else ""
            raise WireError(
                self.reason, f"{what} needs {least}{self.min_length} bytes, {len(buf)} available", 0
            )
        fields = self.layouts[order].unpack_from(buf, 0)
        text_ccsid = struc_id_ccsid(
            fields[0], self.ascii_id, self.ebcdic_id, ccsid, reason=self.reason, what=what
        )
        if self.version is not None and fields[1] != self.version:
            raise WireError(self.reason, f"{what} Version {fields[1]} is not {self.version}", 4)
        return fields, text_ccsid, order
