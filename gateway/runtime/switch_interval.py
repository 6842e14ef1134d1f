"""The interpreter's thread switch interval while a gateway runs (``sys.setswitchinterval``).

Why the application sets it: the embedded queue manager writes each unit of work on its
writer thread (SQLite, fsync), and the broker service gets and handles the next batch on
the event loop meanwhile (docs/performance.md, "Commits overlapped with the next
batch"). The writer needs the GIL around its SQLite calls, and a thread waiting for the
GIL while another runs Python code gets it only after the switch interval: 5 ms by
default. So a commit begun before the loop's next batch ended only once that batch had
been handled, and nothing overlapped. At ``SWITCH_INTERVAL_S`` the write ends while the
batch is still being handled. The interval matters only while a second thread waits for
the GIL: the loop alone is never asked to let go.

A library must not change process-wide settings; ``mqgw run`` and ``mqgw broker`` are
the application, so they do, and the benchmarks that stand for them. Worker processes
do not: they hold no queue manager, so no writer thread.
:func:`apply_switch_interval` returns a :class:`SwitchInterval` whose
:meth:`~SwitchInterval.release` puts the previous interval back after its last holder
(several gateways may run in one test process).
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass

__all__ = ["SWITCH_INTERVAL_S", "SwitchInterval", "apply_switch_interval"]

log = logging.getLogger(__name__)

#: Seconds (measured: docs/performance.md, "Commits overlapped with the next batch").
SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_holders = 0
_saved: float | None = None


@dataclass(slots=True)
class SwitchInterval:
    """What :func:`apply_switch_interval` did; :meth:`release` undoes it once."""

    interval: float
    _released: bool = False

    def release(self) -> None:
        """Put the previous interval back (after the last holder lets go)."""
        global _holders, _saved
        with _lock:
            if self._released:
                return
            self._released = True
            _holders -= 1
            if _holders == 0 and _saved is not None:
                sys.setswitchinterval(_saved)
                _saved = None


def apply_switch_interval(who: str, interval: float = SWITCH_INTERVAL_S) -> SwitchInterval:
    """Set the switch interval to ``interval`` seconds (the first holder saves Python's)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = sys.getswitchinterval()
        _holders += 1
        sys.setswitchinterval(interval)
    log.debug("%s: thread switch interval %.4f s", who, interval)
    return SwitchInterval(interval)
