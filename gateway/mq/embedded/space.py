"""Disk space of one embedded queue manager: a free-space watermark and a reserve.

Why: the gateway's own queues grow while a target is away (a sink's backlog while Kafka
is down). Left alone they fill the disk, and then nothing works any more: SQLite needs
room in its write-ahead log even to commit a delete, so the very gets that would free
space fail, and the gateway cannot recover without an operator freeing space by hand.

So, per data directory:

* **watermark** (``min_free_bytes``): when the room left -- free space on the file
  system plus the free pages inside the store, which new messages reuse -- is below it,
  a put of a *persistent* message is refused with MQRC_Q_SPACE_NOT_AVAILABLE (2056),
  IBM MQ's reason for "no space available for the queue on disk". It is retriable:
  the publish/subscribe service holds the stream as for a full backlog (2053), an
  inbound plugin waits and retries, an application sees what IBM MQ would tell it.
  Gets and commits go on (they free space), and so does a move to the dead-letter queue
  in a unit of work that got messages (a message set aside is not new data). Non-
  persistent messages live in memory and are not refused.
* **reserve** (``reserve_bytes``): a file of that size the store keeps allocated in the
  data directory. When the disk is full anyway (something else filled it), a store
  transaction that only deletes or updates and fails for want of space releases the
  reserve and is tried again once, so the commits that free space still succeed; the
  reserve is made again once there is room for it above the watermark.

The room is measured (a ``statvfs`` and SQLite's free-page count, about 20 µs, then a
check that the reserve is there: on the store's writer thread, under its lock) when it is
due, not after every transaction (:meth:`StoreSpace.due`, :meth:`StoreSpace.wrote`):
after every transaction while puts are refused; otherwise once the last measure is
:data:`MEASURE_EVERY_S` old, once the transactions since wrote an estimated
:data:`MEASURE_EVERY_BYTES`, or once the room last measured, less that estimate, is
within :data:`MARGIN_BYTES` of the watermark. A transaction in between pays a clock read
and, for its inserts, a sum of their body lengths (docs/embedded-qm.md has the figures).

The guarantee is the one a measure after every transaction gives: a persistent put is
accepted only while the room last measured was at least the watermark, so the room falls
below it by at most a unit of work accepted just before the next measure. Far from the
watermark the next measure comes before an estimated MEASURE_EVERY_BYTES is written,
less than MARGIN_BYTES; within MARGIN_BYTES of it, after every transaction. The estimate
counts each inserted body and row twice (the table and the write-ahead log); what other
programs write meanwhile is seen within MEASURE_EVERY_S; what the estimate or they miss
is what the reserve is for. While puts are refused, the room is also measured again at
most every :data:`RECHECK_S` on a refused put (space freed from outside is seen without
a write). The state changes are logged once each way; the refused puts themselves are
not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARGIN_BYTES",
    "MEASURE_EVERY_BYTES",
    "MEASURE_EVERY_S",
    "RECHECK_S",
    "RESERVE_FILE",
    "SpacePolicy",
    "StoreSpace",
]

log = logging.getLogger(__name__)

#: The reserve's file name in the data directory.
RESERVE_FILE = "qmgr.reserve"
#: While puts are refused, the room is measured again at most this often (seconds).
RECHECK_S = 0.5
#: Otherwise the room is measured after a store transaction at least this often
#: (seconds) ...
MEASURE_EVERY_S = 0.05
#: ... and once the transactions since the last measure wrote this much (estimated).
MEASURE_EVERY_BYTES = 1024 * 1024
#: Within this much of the watermark (the room last measured less what was written
#: since), after every transaction. At least MEASURE_EVERY_BYTES: the room cannot
#: pass the watermark unmeasured (see module docstring).
MARGIN_BYTES = 4 * MEASURE_EVERY_BYTES
#: What a row costs on disk besides its body (MQMD, ids, index entry), estimated.
ROW_BYTES = 512
_MB = 1024 * 1024


@dataclass(slots=True, frozen=True)
class SpacePolicy:
    """The watermark and reserve of a data directory (0: none)."""

    min_free_bytes: int = 0
    reserve_bytes: int = 0


class StoreSpace:
    """The room left in one data directory and whether persistent puts are refused.

    ``low`` is read on the event loop for every persistent put (one attribute); it is
    set by :meth:`measure`, called on the store's writer thread after a transaction
    when :meth:`due` says so and on the loop by :meth:`recheck` while low.
    """

    __slots__ = ("_checked", "_name", "_unmeasured", "directory", "low", "policy",
                 "reserve_path", "room", "store_free")

    def __init__(self, directory: Path, policy: SpacePolicy, name: str = "") -> None:
        self.directory = directory
        self.policy = policy
        self._name = name or str(directory)
        self.reserve_path = directory / RESERVE_FILE
        #: bytes of free pages inside the store (new rows reuse them)
        self.store_free = 0
        #: file-system free bytes plus ``store_free``, as last measured
        self.room = 0
        self.low = False
        self._checked = 0.0
        #: bytes written since the last measure (estimated: :meth:`due`)
        self._unmeasured = 0

    @property
    def enabled(self) -> bool:
        return self.policy.min_free_bytes > 0

    def due(self) -> bool:
        """After a store transaction: whether the room must be measured now whatever it
        wrote (puts are refused, or the last measure is MEASURE_EVERY_S old)."""
        return self.low or time.monotonic() - self._checked >= MEASURE_EVERY_S

    def wrote(self, body_bytes: int, rows: int) -> bool:
        """After a store transaction that inserted ``rows`` rows with ``body_bytes`` of
        bodies (when :meth:`due` said no): whether that makes a measure due (see module
        docstring). Deletes and updates alone only free space: never."""
        if not rows:
            return False
        written = self._unmeasured + 2 * (body_bytes + ROW_BYTES * rows)
        self._unmeasured = written
        return (written >= MEASURE_EVERY_BYTES
                or self.room - written < self.policy.min_free_bytes + MARGIN_BYTES)

    def measure(self, store_free: int | None = None) -> None:
        """Measure the room (thread-safe enough: plain attribute writes) and log a
        change of state."""
        if store_free is not None:
            self.store_free = store_free
        self._checked = time.monotonic()
        self._unmeasured = 0
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return
        self.room = st.f_bavail * st.f_frsize + self.store_free
        low = self.room < self.policy.min_free_bytes
        if low != self.low:
            self.low = low
            if low:
                log.warning(
                    "queue manager store %s: the disk is full to its watermark (%.1f MB of "
                    "room, min_free_mb %.0f): persistent puts are refused with MQRC 2056 "
                    "(Q_SPACE_NOT_AVAILABLE) until space is back; gets and commits go on",
                    self._name, self.room / _MB,
                    self.policy.min_free_bytes / _MB,
                )
            else:
                log.warning(
                    "queue manager store %s: space is back above the watermark (%.1f MB "
                    "of room): persistent puts are accepted again",
                    self._name, self.room / _MB,
                )

    def recheck(self) -> bool:
        """While low: measure again if the last measure is older than RECHECK_S;
        whether puts are still refused."""
        if self.low and time.monotonic() - self._checked >= RECHECK_S:
            self.measure()
        return self.low

    # ------------------------------------------------------------- the reserve ----

    def make_reserve(self) -> None:
        """Allocate the reserve file if it is missing and there is room for it above the
        watermark (on the writer thread; a failure leaves no partial file)."""
        size = self.policy.reserve_bytes
        if size <= 0 or self.reserve_path.exists():
            return
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return
        if st.f_bavail * st.f_frsize < size + self.policy.min_free_bytes:
            return
        partial = self.reserve_path.with_suffix(".new")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
            os.replace(partial, self.reserve_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            log.warning("queue manager store %s: cannot make the %.0f MB store reserve: %s",
                        self._name, size / _MB, exc)

    def release_reserve(self) -> bool:
        """Free the reserve (the disk is full); whether there was one."""
        try:
            self.reserve_path.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            return False
        log.warning(
            "queue manager store %s: the disk is full: released the %.0f MB store reserve "
            "so that commits which free space complete; it is made again once there is "
            "room", self._name, self.policy.reserve_bytes / _MB,
        )
        return True
