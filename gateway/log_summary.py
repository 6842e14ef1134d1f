"""One log line per kind per interval, for what outside parties can repeat at will.

Why a module of its own, below every layer: the pub/sub service, request/reply, the
neighbour links and the plugins all log things an outsider decides how often happen (a
junk message, a refused name, a record MQ cannot take), and each must log them the same
bounded way. It imports nothing of the gateway, so plugins may use it too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["SummarisedLog"]


class SummarisedLog:
    """One line per kind per interval for what outsiders can repeat at will.

    Why: a junk message on the reply or inter-broker queue, a refused name, a request the
    MQTT broker refuses -- an outside party decides how often these happen, so logging
    each one lets it fill the disk and bury everything else. The first line of a kind in
    an interval is written whole; the repeats are counted, and when the interval ends one
    line says how many there were (with the last one's text). At most ``max_kinds`` kinds
    are tracked per interval; later kinds are counted under ``other``.

    The summary of an interval is written by the first call after it ends, by a timer on
    the running asyncio loop (so a flood that stops is still summarised), or by
    :meth:`flush` (at stop).
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 60.0,
        max_kinds: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.max_kinds = max_kinds
        self.clock = clock
        self._started = clock()
        #: kind -> [repeats since the first line, level, the last repeat's text]
        self._kinds: dict[str, list[Any]] = {}
        self._timer: asyncio.TimerHandle | None = None
        #: lines written and lines counted instead, for tests and metrics
        self.written = 0
        self.suppressed = 0

    def log(self, level: int, kind: str, msg: str, *args: object) -> None:
        """Log ``msg % args`` at ``level`` unless a line of ``kind`` was written in this
        interval; then count it."""
        now = self.clock()
        if now - self._started >= self.interval:
            self.flush(now)
        entry = self._kinds.get(kind)
        if entry is None and len(self._kinds) >= self.max_kinds:
            kind = "other"
            entry = self._kinds.get(kind)
        if entry is None:
            self._kinds[kind] = [0, level, ""]
            self.written += 1
            self.logger.log(level, msg, *args)
            return
        entry[0] += 1
        entry[1] = max(entry[1], level)
        entry[2] = msg % args if args else msg
        self.suppressed += 1
        self._arm()

    def flush(self, now: float | None = None) -> None:
        """Write the summary of the repeats counted so far and start a new interval."""
        now = self.clock() if now is None else now
        elapsed = now - self._started
        for kind, (repeats, level, last) in self._kinds.items():
            if repeats:
                self.written += 1
                self.logger.log(
                    level, "%d more like this in %.0f s (%s); the last: %s",
                    repeats, elapsed, kind, last,
                )
        self._kinds.clear()
        self._started = now
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = max(0.0, self.interval - (self.clock() - self._started))
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()
