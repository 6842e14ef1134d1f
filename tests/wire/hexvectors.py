"""Load the annotated hex dumps in tests/wire/vectors/ (the reference's §8 format).

Lines are ``OOOO: hexwords  |ascii|``; ``*`` repeats the previous 16-byte line up to the
next offset shown (hexdump -C convention); ``...`` marks an elided gap.
"""

from __future__ import annotations

import pathlib
import re

VECTORS = pathlib.Path(__file__).parent / "vectors"
_LINE = re.compile(r"^([0-9a-fA-F]{4,8}):\s+((?:[0-9a-fA-F]{2,8}\s*)+?)\s*(?:\|.*\|)?\s*$")


def load_segments(name: str) -> list[tuple[int, bytes]]:
    """Contiguous (offset, bytes) runs of vector ``name`` (file stem)."""
    segments: list[tuple[int, bytearray]] = []
    last_line = b""
    pending_repeat = False
    for raw in (VECTORS / f"{name}.hex").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            pending_repeat = True
            continue
        if line.startswith("..."):
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"{name}: cannot parse {raw!r}")
        off = int(m.group(1), 16)
        data = bytes.fromhex(m.group(2).replace(" ", ""))
        if pending_repeat:
            start, buf = segments[-1]
            while start + len(buf) < off:
                buf += last_line
            pending_repeat = False
        if segments and segments[-1][0] + len(segments[-1][1]) == off:
            segments[-1][1].extend(data)
        else:
            segments.append((off, bytearray(data)))
        last_line = data
    return [(o, bytes(b)) for o, b in segments]


def load(name: str) -> bytes:
    """The whole vector; it must be one run starting at offset 0."""
    segments = load_segments(name)
    assert len(segments) == 1 and segments[0][0] == 0, f"{name} is not contiguous from 0"
    return segments[0][1]
