"""A tiny progress reporter for long CLI work, on stderr.

While work goes on it redraws one line (``\\r``) when the stream is a terminal, or, when
asked for explicitly (``--progress``) on a stream that is not one, writes a plain line at
most every ``interval`` seconds; otherwise it stays silent. The final summary line
(``<what>: <count> <unit> in <seconds> s``) is written always, so scripts and logs see how
much was done. Dependency-free: no curses, no third-party bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Counts work done and shows it; :meth:`finish` writes the summary line."""

    def __init__(
        self,
        what: str,
        unit: str,
        *,
        stream: TextIO | None = None,
        force: bool = False,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        #: live updates shown: on a terminal, or when asked for (``--progress``)
        self.live = self.tty or force
        self.interval = interval
        self.count = 0
        self._clock = clock
        self._started = clock()
        self._last_shown: float | None = None
        self._drawn = False  # a \r line is on the terminal

    def update(self, count: int | None = None, detail: str = "") -> None:
        """Set the count (default: one more) and show it if it is time to."""
        self.count = self.count + 1 if count is None else count
        if not self.live:
            return
        now = self._clock()
        if self._last_shown is not None and now - self._last_shown < self.interval:
            return
        self._last_shown = now
        text = f"{self.what}: {self.count} {self.unit}" + (f" ({detail})" if detail else "")
        if self.tty:
            self.stream.write(f"\r\x1b[K{text}")
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self, detail: str = "") -> str:
        """Write (always) and return the summary line, replacing a live line."""
        elapsed = self._clock() - self._started
        line = f"{self.what}: {self.count} {self.unit} in {elapsed:.1f} s"
        if detail:
            line += f" ({detail})"
        prefix = "\r\x1b[K" if self._drawn else ""
        self.stream.write(prefix + line + "\n")
        self.stream.flush()
        self._drawn = False
        return line


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
