"""Backouts the service forgives, kept durably (issue 12 item 8).

When a sink's backlog queue is full (MQRC 2053), the stream batch is backed out so the
stream waits: back-pressure, not a fault of its messages. MQ still adds one to each
message's BackoutCount, so the service remembers, per MsgId, how many of those backouts
were its own and subtracts them before comparing with the queue's BOTHRESH. Held in
memory only, that number was lost at a restart, and repeated restarts during a long
outage could push an innocent publication to the backout or dead-letter queue. So the
numbers live in a small table beside the pub/sub store and are loaded at start.

Writes happen only when a batch is forgiven and when a forgiven message is finally
committed: nothing on the ordinary hot path.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ForgivenBackouts"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS mqgw_forgiven_backouts "
    "(msg_id BLOB PRIMARY KEY, count INTEGER NOT NULL)"
)


class ForgivenBackouts:
    """MsgId -> backouts forgiven; durable when given a database path, else in memory."""

    def __init__(self, path: Path | None = None) -> None:
        self._db: sqlite3.Connection | None = None
        self._counts: dict[bytes, int] = {}
        if path is not None:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: durable across a process crash (the restarts this is
            # for) without an fsync per write on the event loop.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
            self._counts = {bytes(m): int(c) for m, c in db.execute(
                "SELECT msg_id, count FROM mqgw_forgiven_backouts"
            )}
            self._db = db

    def get(self, msg_id: bytes) -> int:
        """Backouts of ``msg_id`` that were the service's own."""
        return self._counts.get(msg_id, 0)

    def forgive(self, msg_ids: Iterable[bytes]) -> None:
        """One more forgiven backout for each of ``msg_ids`` (a batch backed out for
        back-pressure); durable before this returns."""
        changed = []
        for msg_id in msg_ids:
            n = self._counts.get(msg_id, 0) + 1
            self._counts[msg_id] = n
            changed.append((msg_id, n))
        if changed and self._db is not None:
            with self._db:
                self._db.executemany(
                    "INSERT INTO mqgw_forgiven_backouts (msg_id, count) VALUES (?, ?) "
                    "ON CONFLICT(msg_id) DO UPDATE SET count = excluded.count",
                    changed,
                )

    def settle(self, msg_ids: Iterable[bytes]) -> None:
        """``msg_ids`` were committed: forget what was forgiven for them."""
        gone = [m for m in msg_ids if self._counts.pop(m, None) is not None]
        if gone and self._db is not None:
            with self._db:
                self._db.executemany(
                    "DELETE FROM mqgw_forgiven_backouts WHERE msg_id = ?", [(m,) for m in gone]
                )

    def __len__(self) -> int:
        return len(self._counts)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
