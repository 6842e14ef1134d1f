"""When an unanswered proxy command is put again (pure; the links ask it).

Why its own rule: an unanswered RegSub/DeregSub is usually not lost but waiting (on our
transmission queue while the channel is down, or at the neighbour), and before issue 29
it was put again every 30 s for ever: one more copy of every proxy per 30 s on the
transmission queue, and memory with it. Now a command is put again only

* after its backoff: 30 s, doubled per resend up to 10 min, each wait varied by ±20 %;
* when nothing waits on the transmission queue towards the neighbour (the links look,
  :mod:`.transmission`), and
* when the neighbour was heard from since the last put (something came back: the
  channel and the neighbour work, yet this command went unanswered), or, once the
  backoff has reached its 10 min, even when it was not: the command or its answer may
  have been lost (an answer dead-lettered on our full inter-broker queue), and a
  neighbour that publishes nothing to us until its proxy is registered would never be
  heard from. While the neighbour stays silent each look doubles the backoff, so such
  a command goes again about 25 min after its put, then every 10 min; only when the
  transmission queue is known to be empty (never while a copy waits there; when its
  depth cannot be told, the neighbour must have been heard from).

A command whose put failed is tried again after 5 s doubling to 10 min; one this
process never put (sent before a restart) goes once nothing waits on the transmission
queue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RESEND_AFTER", "RESEND_JITTER", "RESEND_MAX", "RETRY_PUT_AFTER", "Resends"]

RESEND_AFTER = 30.0
RESEND_MAX = 600.0
RESEND_JITTER = 0.2
RETRY_PUT_AFTER = 5.0


@dataclass(slots=True)
class _InFlight:
    """A proxy command this process put (or tried to) that no response settled yet."""

    #: when it was last put (0.0: never: its put failed)
    put_at: float = 0.0
    #: not looked at again before this
    next_at: float = 0.0
    #: the wait before the next resend, and before the next retry of a failed put
    delay: float = RESEND_AFTER
    retry: float = 0.0


def _jittered(delay: float) -> float:
    return delay * random.uniform(1.0 - RESEND_JITTER, 1.0 + RESEND_JITTER)


class Resends:
    """The unanswered proxy commands by MsgId, and when each neighbour was last heard
    from (module docstring)."""

    def __init__(self) -> None:
        self._sent: dict[bytes, _InFlight] = {}
        self._heard: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def heard(self, q_mgr: str, now: float) -> None:
        self._heard[q_mgr] = now

    def looked_at(self, msg_id: bytes, now: float) -> bool:
        """False while ``msg_id``'s backoff (or put retry) has not passed."""
        f = self._sent.get(msg_id)
        return f is None or now >= f.next_at

    def due(self, q_mgr: str, msg_id: bytes, now: float, waiting: bool | None) -> bool:
        """May ``msg_id`` (to ``q_mgr``, its backoff passed) be put again now?
        ``waiting``: messages wait on the transmission queue towards ``q_mgr`` (None:
        that cannot be told). When not, it is looked at again after its backoff, which
        doubles while the neighbour stays silent (module docstring)."""
        f = self._sent.get(msg_id)
        if f is not None and not f.put_at:
            return True  # its put failed: nothing of it is on the way
        if f is None:
            if not waiting:
                return True
            self._sent[msg_id] = f = _InFlight(put_at=now)  # presumed on its way
        elif not waiting:
            if self._heard.get(q_mgr, 0.0) >= f.put_at:
                return True
            if waiting is False:
                if f.delay >= RESEND_MAX:
                    return True  # silent for the longest backoff: lost, not waiting
                f.delay = min(2 * f.delay, RESEND_MAX)
        f.next_at = now + _jittered(f.delay)
        return False

    def put(self, msg_id: bytes, now: float) -> None:
        """``msg_id`` was put (committed): a resend makes the next wait longer."""
        f = self._sent.get(msg_id)
        if f is None:
            self._sent[msg_id] = _InFlight(now, now + _jittered(RESEND_AFTER))
            return
        if f.put_at:
            f.delay = min(2 * f.delay, RESEND_MAX)
        f.put_at, f.retry = now, 0.0
        f.next_at = now + _jittered(f.delay)

    def put_failed(self, msg_id: bytes, now: float) -> None:
        """``msg_id``'s put failed: tried again after its retry delay (doubling)."""
        f = self._sent.setdefault(msg_id, _InFlight())
        f.retry = min(max(RETRY_PUT_AFTER, 2 * f.retry), RESEND_MAX)
        f.next_at = now + f.retry

    def settled(self, msg_id: bytes) -> None:
        self._sent.pop(msg_id, None)

    def keep_only(self, pending: set[bytes]) -> None:
        """Forget every command not in ``pending`` (settled, cleared, admin)."""
        self._sent = {k: v for k, v in self._sent.items() if k in pending}
