"""Messages per second from monotonically growing counters (pure: the caller gives the
clock), over a short sliding window so a burst shows for a few seconds and then fades."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["RateWindow"]

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class RateWindow(Generic[K]):
    """Samples of ``key -> count`` kept for ``window_s`` seconds; a new sample is taken
    at most every ``min_spacing_s`` (several viewers do not shorten the window). Samples
    are taken only while someone watches: after a gap longer than the window the old
    ones are dropped, so the rate shown is never growth over the gap / the gap."""

    window_s: float = 5.0
    min_spacing_s: float = 0.5
    _samples: deque[tuple[float, dict[K, int]]] = field(default_factory=deque)

    def observe(self, now: float, counts: Mapping[K, int]) -> None:
        """Add a sample (ignored when the last one is younger than ``min_spacing_s``)."""
        if self._samples and now - self._samples[-1][0] < self.min_spacing_s:
            return
        if self._samples and now - self._samples[-1][0] > self.window_s:
            # nobody sampled for longer than the window (no viewer): what grew during the
            # gap is not "now", so start afresh rather than average over the gap
            self._samples.clear()
        self._samples.append((now, dict(counts)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self, key: K) -> float:
        """Per second between the oldest and newest sample (0.0 with fewer than two);
        a counter that went down (a restart) counts from zero."""
        if len(self._samples) < 2:
            return 0.0
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return 0.0
        start, end = first.get(key, 0), last.get(key, 0)
        grown = end - start if end >= start else end
        return grown / (t1 - t0)
