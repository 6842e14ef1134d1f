"""The correlation store: open and finished request/reply entries in one SQLite file.

Why SQLite with synchronous=FULL: every step of the once/in-order rules
(docs/request-reply.md) is "store write, then the next hop"; a write that returned must
survive a process kill or power loss, or a redelivered request or reply could not be
recognised. Each method is one statement in autocommit mode, so each is one durable
transaction. The one exception is the "sent" mark (:meth:`mark_sent`): it is written
without a flush of its own (WAL, synchronous=NORMAL for that transaction), since a
mark a power loss takes back only makes a redelivered request be put again with the
same MsgId, the at-least-once window the mark narrows; a process kill keeps it, and the
next durable write flushes it. Finished (DONE) entries are kept for ``retention``
seconds to filter duplicates, then purged.

Exclusive ownership: an ``fcntl`` lock on ``<file>.lock`` held while open, as the
embedded queue manager's store does; a second process gets :class:`StoreInUseError`.
Methods are synchronous and serialised by an internal lock (callers may use a thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gateway.routing.correlation import PendingRequest, PendingService, State

__all__ = [
    "SCHEMA_VERSION",
    "CorrelationStore",
    "CorrelationStoreError",
    "SchemaVersionError",
    "StoreInUseError",
]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    key BLOB PRIMARY KEY, route TEXT NOT NULL, source_id TEXT NOT NULL,
    reply_topic TEXT NOT NULL, correlation_data BLOB NOT NULL, msg_id BLOB NOT NULL,
    deadline REAL NOT NULL, state TEXT NOT NULL, outcome TEXT NOT NULL,
    sent INTEGER NOT NULL, finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0, retry_at REAL, refused_since REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS requests_due ON requests (state, deadline);
CREATE TABLE IF NOT EXISTS services (
    token BLOB PRIMARY KEY, route TEXT NOT NULL, msg_id BLOB NOT NULL,
    correl_id BLOB NOT NULL, reply_to_q TEXT NOT NULL, reply_to_q_mgr TEXT NOT NULL,
    report INTEGER NOT NULL, persistence INTEGER NOT NULL, priority INTEGER NOT NULL,
    expiry_at REAL, deadline REAL NOT NULL, state TEXT NOT NULL, outcome TEXT NOT NULL,
    finished_at REAL, produced INTEGER NOT NULL DEFAULT 1,
    attempts INTEGER NOT NULL DEFAULT 0, retry_at REAL, refused_since REAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS services_due ON services (state, deadline);
"""

#: Columns added after the first files were written: (table, column, definition). A file
#: without one gets it on open (``ALTER TABLE ... ADD COLUMN``); the default is what the
#: entries of such a file mean (a service entry then was produced already; nothing had
#: been retried; no destination had refused).
_ADDED_COLUMNS = (
    ("services", "produced", "INTEGER NOT NULL DEFAULT 1"),
    ("requests", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("requests", "retry_at", "REAL"),
    ("services", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("services", "retry_at", "REAL"),
    ("requests", "refused_since", "REAL"),
    ("services", "refused_since", "REAL"),
)

#: When the sweeper next looks at an open entry: its deadline, or after a failed try the
#: time of the next one. Indexed, so ``due`` does not scan the table.
_NEXT = "COALESCE(retry_at, deadline)"
_NEXT_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS requests_next ON requests (state, {_NEXT})",
    f"CREATE INDEX IF NOT EXISTS services_next ON services (state, {_NEXT})",
)

_REQUEST_COLUMNS = (
    "key, route, source_id, reply_topic, correlation_data, msg_id, deadline, state, outcome,"
    " sent, attempts, retry_at, refused_since"
)
_SERVICE_COLUMNS = (
    "token, route, msg_id, correl_id, reply_to_q, reply_to_q_mgr, report, persistence,"
    " priority, expiry_at, deadline, state, outcome, produced, attempts, retry_at,"
    " refused_since"
)


class CorrelationStoreError(Exception):
    """The correlation store cannot be opened, read or written."""


class StoreInUseError(CorrelationStoreError):
    """Another process has the store open."""

    def __init__(self, path: Path, owner: str) -> None:
        super().__init__(
            f"correlation store {path} is in use by another process ({owner}); "
            "stop that gateway or give this one its own request_reply.store"
        )
        self.path = path
        self.owner = owner


class SchemaVersionError(CorrelationStoreError):
    """The file was written by a gateway with another schema version."""


_INSERT_REQUEST = (
    f"INSERT INTO requests ({_REQUEST_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
    " ON CONFLICT DO NOTHING"
)


def _request_row(p: PendingRequest) -> tuple[Any, ...]:
    """The ``requests`` row of ``p`` (``_REQUEST_COLUMNS`` order)."""
    return (p.key, p.route, p.source_id, p.reply_topic, p.correlation_data, p.msg_id,
            p.deadline, str(p.state), p.outcome, int(p.sent), p.attempts, p.retry_at,
            p.refused_since)


def _request_from(row: Any) -> PendingRequest:
    return PendingRequest(
        key=bytes(row[0]),
        route=row[1],
        source_id=row[2],
        reply_topic=row[3],
        correlation_data=bytes(row[4]),
        msg_id=bytes(row[5]),
        deadline=row[6],
        state=State(row[7]),
        outcome=row[8],
        sent=bool(row[9]),
        attempts=int(row[10]),
        retry_at=row[11],
        refused_since=row[12],
    )


def _service_from(row: Any) -> PendingService:
    return PendingService(
        token=bytes(row[0]),
        route=row[1],
        msg_id=bytes(row[2]),
        correl_id=bytes(row[3]),
        reply_to_q=row[4],
        reply_to_q_mgr=row[5],
        report=row[6],
        persistence=row[7],
        priority=row[8],
        expiry_at=row[9],
        deadline=row[10],
        state=State(row[11]),
        outcome=row[12],
        produced=bool(row[13]),
        attempts=int(row[14]),
        retry_at=row[15],
        refused_since=row[16],
    )


def _next_look(p: PendingRequest | PendingService) -> float:
    """When the sweeper looks at ``p`` next (the ``_NEXT`` expression, in Python)."""
    return p.deadline if p.retry_at is None else p.retry_at


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            owner = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown pid"
        finally:
            os.close(fd)
        raise StoreInUseError(path, owner) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    os.fsync(fd)
    return fd


class CorrelationStore:
    """Requester and service entries, keyed by the 24 bytes MQ carries back."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mutex = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CorrelationStoreError(
                f"cannot be created ({exc.strerror}: {exc.filename})"
            ) from exc
        try:
            self._lock_fd = _lock(self.path.with_name(self.path.name + ".lock"))
        except OSError as exc:
            raise CorrelationStoreError(f"{exc.filename}: {exc.strerror}") from exc
        try:
            self._db = self._open()
        except BaseException:
            self._release_lock()
            raise

    def _open(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise CorrelationStoreError(f"cannot open {self.path}: {exc}") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            for table, column, definition in _ADDED_COLUMNS:
                columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                if column not in columns:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
            for statement in _NEXT_INDEXES:
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise SchemaVersionError(
                    f"correlation store {self.path} has schema version {row[0]}; this "
                    f"gateway reads version {SCHEMA_VERSION} (move the file away to start "
                    "empty: open entries in it are then answered by nobody)"
                )
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            db.close()
            raise CorrelationStoreError(f"cannot open {self.path}: {exc}") from exc
        except BaseException:
            db.close()
            raise
        return db

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self) -> None:
        """Close the file and release the lock (idempotent)."""
        with self._mutex:
            if self._lock_fd < 0:
                return
            self._db.close()
            self._release_lock()

    def _fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._mutex:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise CorrelationStoreError(f"{self.path}: {exc}") from exc

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        """Run one statement as its own durable transaction; the rows it changed."""
        with self._mutex:
            try:
                return self._db.execute(sql, args).rowcount
            except sqlite3.Error as exc:
                raise CorrelationStoreError(f"{self.path}: {exc}") from exc

    def _write_many(
        self, sql: str, rows: Sequence[tuple[Any, ...]], *, flush: bool = True
    ) -> None:
        """Run one statement for each of ``rows``, all in one durable transaction
        (``flush=False``: one transaction not flushed to disk on its own; the module
        docstring says when that is enough)."""
        if not rows:
            return
        with self._mutex:
            if flush:
                with self._transaction():
                    self._db.executemany(sql, rows)
                return
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                with self._transaction():
                    self._db.executemany(sql, rows)
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; whatever ends it early rolls it back, so no later
        statement runs inside a transaction left open (the caller holds ``_mutex``)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the first error is the one to tell
                    self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise CorrelationStoreError(f"{self.path}: {exc}") from exc
            raise

    # ---- requester side ---------------------------------------------------------

    def add_request(self, p: PendingRequest) -> bool:
        """Record ``p``; False (and nothing written) when its key is already present."""
        return self._write(_INSERT_REQUEST, _request_row(p)) == 1

    def add_requests(self, entries: Sequence[PendingRequest]) -> None:
        """Record ``entries`` (those whose key is present already are left as they are)
        in one durable transaction: one fsync for a batch of requests, not one each."""
        self._write_many(_INSERT_REQUEST, [_request_row(p) for p in entries])

    def request(self, key: bytes) -> PendingRequest | None:
        rows = self._fetch(f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE key=?", (key,))
        return _request_from(rows[0]) if rows else None

    def mark_sent(self, key: bytes) -> None:
        """The MQ put of the request has committed (written without a flush of its own:
        module docstring)."""
        self.mark_all_sent([key])

    def mark_all_sent(self, keys: Sequence[bytes]) -> None:
        """:meth:`mark_sent` of each of ``keys``, in one transaction."""
        self._write_many(
            "UPDATE requests SET sent=1 WHERE key=?", [(k,) for k in keys], flush=False
        )

    def finish_request(self, key: bytes, outcome: str, now: float) -> bool:
        """OPEN -> DONE with ``outcome``; False when the entry is absent or not OPEN."""
        changed = self._write(
            "UPDATE requests SET state=?, outcome=?, finished_at=? WHERE key=? AND state=?",
            (str(State.DONE), outcome, now, key, str(State.OPEN)),
        )
        return changed == 1

    def finish_requests(self, outcomes: Sequence[tuple[bytes, str]], now: float) -> None:
        """:meth:`finish_request` of each (key, outcome), in one durable transaction:
        one flush for the replies of a unit of work, not one each."""
        self._write_many(
            "UPDATE requests SET state=?, outcome=?, finished_at=? WHERE key=? AND state=?",
            [(str(State.DONE), outcome, now, key, str(State.OPEN)) for key, outcome in outcomes],
        )

    # ---- service side -----------------------------------------------------------

    def add_service(self, p: PendingService) -> bool:
        """Record ``p``; False (and nothing written) when its token is already present."""
        changed = self._write(
            f"INSERT INTO services ({_SERVICE_COLUMNS})"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT DO NOTHING",
            (
                p.token,
                p.route,
                p.msg_id,
                p.correl_id,
                p.reply_to_q,
                p.reply_to_q_mgr,
                p.report,
                p.persistence,
                p.priority,
                p.expiry_at,
                p.deadline,
                str(p.state),
                p.outcome,
                int(p.produced),
                p.attempts,
                p.retry_at,
                p.refused_since,
            ),
        )
        return changed == 1

    def mark_service_produced(self, token: bytes) -> None:
        """The request has been produced to the responder."""
        self._write("UPDATE services SET produced=1 WHERE token=?", (token,))

    def service(self, token: bytes) -> PendingService | None:
        rows = self._fetch(f"SELECT {_SERVICE_COLUMNS} FROM services WHERE token=?", (token,))
        return _service_from(rows[0]) if rows else None

    def finish_service(self, token: bytes, outcome: str, now: float) -> bool:
        """OPEN -> DONE with ``outcome``; False when the entry is absent or not OPEN."""
        changed = self._write(
            "UPDATE services SET state=?, outcome=?, finished_at=? WHERE token=? AND state=?",
            (str(State.DONE), outcome, now, token, str(State.OPEN)),
        )
        return changed == 1

    # ---- both -------------------------------------------------------------------

    def due(self, now: float, limit: int = 100) -> list[PendingRequest | PendingService]:
        """OPEN entries the sweeper should look at by ``now``, at most ``limit``: those
        whose deadline has passed, except those it tried and could not finish whose next
        try (:meth:`postpone_request`, :meth:`postpone_service`) is later; the soonest
        first. So entries that keep failing drop behind the others instead of filling
        every batch."""
        open_ = str(State.OPEN)
        requests = [
            _request_from(r)
            for r in self._fetch(
                f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE state=? AND {_NEXT}<=?"
                f" ORDER BY {_NEXT} LIMIT ?",
                (open_, now, limit),
            )
        ]
        services = [
            _service_from(r)
            for r in self._fetch(
                f"SELECT {_SERVICE_COLUMNS} FROM services WHERE state=? AND {_NEXT}<=?"
                f" ORDER BY {_NEXT} LIMIT ?",
                (open_, now, limit),
            )
        ]
        both: list[PendingRequest | PendingService] = [*requests, *services]
        both.sort(key=_next_look)
        return both[:limit]

    def postpone_request(
        self, key: bytes, retry_at: float, refused_at: float | None = None
    ) -> None:
        """The sweeper could not finish the OPEN entry ``key``: one more attempt, the next
        at ``retry_at``. ``refused_at``: its destination refused (not an outage); the
        first such time is kept as ``refused_since``."""
        self._write(
            "UPDATE requests SET attempts=attempts+1, retry_at=?,"
            " refused_since=COALESCE(refused_since, ?) WHERE key=? AND state=?",
            (retry_at, refused_at, key, str(State.OPEN)),
        )

    def postpone_service(
        self, token: bytes, retry_at: float, refused_at: float | None = None
    ) -> None:
        """:meth:`postpone_request` for the service entry ``token``."""
        self._write(
            "UPDATE services SET attempts=attempts+1, retry_at=?,"
            " refused_since=COALESCE(refused_since, ?) WHERE token=? AND state=?",
            (retry_at, refused_at, token, str(State.OPEN)),
        )

    def purge(self, now: float, retention: float) -> int:
        """Delete DONE entries finished more than ``retention`` seconds ago; how many.

        An entry added already DONE (never finished through this store) counts as
        finished at its deadline."""
        cutoff = now - retention
        done = str(State.DONE)
        with self._mutex, self._transaction():
            n = self._db.execute(
                "DELETE FROM requests WHERE state=? AND COALESCE(finished_at, deadline)<=?",
                (done, cutoff),
            ).rowcount
            n += self._db.execute(
                "DELETE FROM services WHERE state=? AND COALESCE(finished_at, deadline)<=?",
                (done, cutoff),
            ).rowcount
        return n

    def counts(self) -> dict[str, int]:
        """Entries per side and state: requester_open, requester_done, service_open,
        service_done."""
        out = {f"{side}_{state}": 0 for side in ("requester", "service") for state in State}
        for side, table in (("requester", "requests"), ("service", "services")):
            for state, n in self._fetch(f"SELECT state, COUNT(*) FROM {table} GROUP BY state"):
                out[f"{side}_{state}"] = int(n)
        return out

    def open_by_route(self) -> dict[str, int]:
        """Open entries (waiting for a reply) per route, both sides (the dashboard's
        in-flight count)."""
        out: dict[str, int] = {}
        for table in ("requests", "services"):
            sql = f"SELECT route, COUNT(*) FROM {table} WHERE state=? GROUP BY route"
            for route, n in self._fetch(sql, (State.OPEN,)):
                out[str(route)] = out.get(str(route), 0) + int(n)
        return out
