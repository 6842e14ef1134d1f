"""When an unanswered proxy command is put again (resend.py, pure)."""

from __future__ import annotations

import math

from gateway.runtime.neighbours.resend import RESEND_AFTER, RESEND_JITTER, RESEND_MAX, Resends

#: Past any backoff (the longest with its jitter).
PAST = RESEND_MAX * (1 + RESEND_JITTER) + 1
#: Looks at a silent neighbour's command before the backoff has reached RESEND_MAX.
LOOKS_TO_MAX = math.ceil(math.log2(RESEND_MAX / RESEND_AFTER))
#: When the first put happens (any time but 0.0).
START = 1000.0


def _looks(r: Resends, waiting: bool | None, n: int, now: float) -> tuple[list[bool], float]:
    """``n`` looks at command ``m`` to the silent neighbour B, each past its backoff."""
    out = []
    for _ in range(n):
        now += PAST
        assert r.looked_at(b"m", now)
        out.append(r.due("B", b"m", now, waiting))
    return out, now


def test_a_silent_neighbours_command_goes_again_once_the_backoff_is_longest() -> None:
    """Known empty transmission queue: sent again at the longest backoff, never while
    a copy waits. Depth unknown (a cluster transmission queue): a copy may wait unseen,
    so only a neighbour heard from since the put gets one more."""
    r = Resends()
    r.put(b"m", START)
    due, now = _looks(r, False, LOOKS_TO_MAX + 1, START)
    assert due == [False] * LOOKS_TO_MAX + [True]
    r.put(b"m", now)
    due, now = _looks(r, True, 3, now)
    assert due == [False] * 3  # a copy waits: never another
    due, now = _looks(r, False, 1, now)
    assert due == [True]  # at the longest backoff: every look

    r = Resends()
    r.put(b"m", START)
    due, now = _looks(r, None, LOOKS_TO_MAX + 3, START)
    assert not any(due)
    r.heard("B", now)
    assert _looks(r, None, 1, now)[0] == [True]
