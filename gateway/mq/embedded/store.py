"""Durable storage of one embedded queue manager: SQLite in WAL mode.

What is stored: object definitions, queue-manager attributes and **persistent** messages
only. Non-persistent messages live in memory and are gone after a restart, as on IBM MQ
(MQPER_NOT_PERSISTENT messages do not survive a queue-manager restart).

Durability: every unit of work that touches persistent messages is one SQLite
transaction committed with ``synchronous=FULL`` (the WAL is fsynced before COMMIT
returns), so a commit that returned survives a process kill or power loss, and a
transaction cut short by a kill is rolled back by SQLite on the next open.

Exclusive ownership: one process owns a queue manager's data directory at a time,
enforced by an ``fcntl`` lock on ``qmgr.lock`` held for the life of the store. A second
opener gets :class:`DataDirInUseError` naming the owner's pid instead of a corrupt queue.

All methods are synchronous and serialised by an internal lock; the queue manager calls
the message-writing ones from its own writer thread so the event loop never waits on
their fsync; definition changes (MQSC) are written on the caller's thread.

Shared bodies (schema 2): one publication fanned out to many subscriber queues is many
messages with the *same* body object. A transaction that inserts one body object of at
least ``SHARED_BODY_MIN`` bytes two or more times stores it once, in ``bodies``, and
each message row refers to it (``body_id``, ``body`` left empty). A trigger drops the
shared body in the same transaction as the delete of its last message, so a crash can
never leave a message without its body, nor a body nobody refers to. A schema-1 data
directory is upgraded in place when opened; an older version refuses a schema-2 one.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.mq.embedded.objects import ChannelDef, ObjectCatalogue, QMgrAttrs, QueueDef
from gateway.mq.embedded.space import SpacePolicy, StoreSpace

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
#: A body object inserted at least twice in one transaction and at least this long is
#: stored once (``bodies``); shorter ones are cheaper copied than referred to.
SHARED_BODY_MIN = 256
DB_FILE = "qmgr.sqlite3"
LOCK_FILE = "qmgr.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    priority INTEGER NOT NULL,
    msg_id BLOB NOT NULL,
    correl_id BLOB NOT NULL,
    put_at REAL NOT NULL,
    expiry_at REAL,
    backout_count INTEGER NOT NULL,
    md BLOB NOT NULL,
    body BLOB NOT NULL,
    body_id INTEGER
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages (queue, seq);
CREATE TABLE IF NOT EXISTS channels (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS channel_sync (
    channel TEXT PRIMARY KEY,
    batch_seq INTEGER NOT NULL,
    msg_ids BLOB NOT NULL
);
"""

#: Schema 2: bodies shared by several messages (see the module docstring). ``refs`` is
#: how many message rows refer to the body; the delete of the last one drops it.
_BODIES = """
CREATE TABLE IF NOT EXISTS bodies (
    id INTEGER PRIMARY KEY,
    refs INTEGER NOT NULL,
    data BLOB NOT NULL
)"""
_BODY_RELEASE = """
CREATE TRIGGER IF NOT EXISTS message_body_release AFTER DELETE ON messages
WHEN old.body_id IS NOT NULL
BEGIN
    UPDATE bodies SET refs = refs - 1 WHERE id = old.body_id;
    DELETE FROM bodies WHERE id = old.body_id AND refs <= 0;
END"""


class StoreError(Exception):
    """The data directory cannot be used (locked, damaged, newer schema)."""


class DataDirInUseError(StoreError):
    """Another process owns this queue manager's data directory."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        super().__init__(
            f"queue manager data directory {path} is in use by another process ({owner}); "
            "one process owns a queue manager at a time: stop it or connect through it"
        )


@dataclass(slots=True, frozen=True)
class ChannelSync:
    """A channel's synchronisation record (IBM MQ's SYSTEM.CHANNEL.SYNCQ entry): the last
    batch committed on this side and the transmission-queue MsgIds it carried."""

    channel: str
    batch_seq: int
    msg_ids: bytes = b""


@dataclass(slots=True)
class StoredMessage:
    """A persistent message row. ``md`` is the packed MQMD (v2, native encoding)."""

    seq: int
    queue: str
    priority: int
    msg_id: bytes
    correl_id: bytes
    put_at: float
    expiry_at: float | None
    backout_count: int
    md: bytes
    body: bytes


class MessageStore:
    """The SQLite file of one queue manager, opened exclusively. ``space``: its free-
    space watermark and reserve (:mod:`.space`; none by default)."""

    def __init__(self, directory: Path | str, space: SpacePolicy | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _acquire_dir_lock(self.directory)
        self._mutex = threading.Lock()
        try:
            self._db = sqlite3.connect(
                self.directory / DB_FILE, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is not None and int(row[0]) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.directory} was written by a newer version (schema {row[0]})"
                )
            if row is not None and int(row[0]) < SCHEMA_VERSION:
                log.warning(
                    "upgrading the queue manager's store in %s from schema %s to %s; "
                    "versions before this one refuse it afterwards (to roll back, "
                    "restore a backup taken before the upgrade)",
                    self.directory, row[0], SCHEMA_VERSION,
                )
            # Every open: the statements are idempotent, so a table or index added
            # later without a schema bump still reaches existing directories.
            self._create_or_upgrade()
        except sqlite3.DatabaseError as exc:
            os.close(self._lock_fd)
            raise StoreError(f"cannot open {self.directory / DB_FILE}: {exc}") from exc
        except StoreError:
            os.close(self._lock_fd)
            raise
        self._closed = False
        self.space = StoreSpace(self.directory, space or SpacePolicy())
        self._page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        #: message rows per INSERT statement (see :func:`insert_chunks`)
        self._insert_rows = rows_per_insert(
            self._db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        )
        if self.space.enabled:
            self.space.make_reserve()
            self.space.measure(self._free_pages_bytes())

    def _create_or_upgrade(self) -> None:
        """Create the tables of a new directory, or upgrade a schema-1 one (adds the
        ``body_id`` column and the shared bodies), in one transaction."""
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(messages)")}
            if "body_id" not in columns:
                self._db.execute("ALTER TABLE messages ADD COLUMN body_id INTEGER")
            self._db.execute(_BODIES)
            self._db.execute(_BODY_RELEASE)
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)",
                (str(SCHEMA_VERSION),),
            )

    # ------------------------------------------------------------------ catalogue

    def load_catalogue(self) -> ObjectCatalogue | None:
        """The stored definitions, or None for a new data directory."""
        with self._mutex:
            row = self._db.execute("SELECT value FROM meta WHERE key='qmgr'").fetchone()
            if row is None:
                return None
            cat = ObjectCatalogue(QMgrAttrs.from_json(json.loads(row[0])))
            for name, definition in self._db.execute("SELECT name, definition FROM queues"):
                cat.queues[name] = QueueDef.from_json(json.loads(definition))
            for name, definition in self._db.execute("SELECT name, definition FROM channels"):
                cat.channels[name] = ChannelDef.from_json(json.loads(definition))
            return cat

    def save_catalogue(self, cat: ObjectCatalogue) -> None:
        with self._mutex, self._transaction():
            self._put_qmgr(cat.qmgr)
            for d in cat.queues.values():
                self._put_queue(d)

    def save_qmgr(self, attrs: QMgrAttrs) -> None:
        with self._mutex, self._transaction():
            self._put_qmgr(attrs)

    def save_queue(self, definition: QueueDef) -> None:
        with self._mutex, self._transaction():
            self._put_queue(definition)

    def save_channel(self, definition: ChannelDef) -> None:
        with self._mutex, self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO channels (name, definition) VALUES (?, ?)",
                (definition.name, json.dumps(definition.to_json())),
            )

    def delete_channel(self, name: str) -> None:
        with self._mutex, self._transaction():
            self._db.execute("DELETE FROM channels WHERE name=?", (name,))
            self._db.execute("DELETE FROM channel_sync WHERE channel LIKE ?", (name + "%",))

    def load_channel_sync(self) -> dict[str, ChannelSync]:
        with self._mutex:
            rows = self._db.execute(
                "SELECT channel, batch_seq, msg_ids FROM channel_sync"
            ).fetchall()
        return {r[0]: ChannelSync(r[0], int(r[1]), bytes(r[2])) for r in rows}

    def delete_queue(self, name: str) -> None:
        """Delete a definition and its persistent messages in one transaction."""
        with self._mutex, self._transaction():
            self._db.execute("DELETE FROM queues WHERE name=?", (name,))
            self._db.execute("DELETE FROM messages WHERE queue=?", (name,))

    def _put_qmgr(self, attrs: QMgrAttrs) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('qmgr', ?)",
            (json.dumps(attrs.to_json()),),
        )

    def _put_queue(self, d: QueueDef) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO queues (name, definition) VALUES (?, ?)",
            (d.name, json.dumps(d.to_json())),
        )

    # ------------------------------------------------------------------ messages

    def load_messages(self) -> list[StoredMessage]:
        """All persistent messages, in arrival order. A shared body is loaded once and
        handed to every message that refers to it (as it was while running)."""
        with self._mutex:
            rows = self._db.execute(
                "SELECT m.seq, m.queue, m.priority, m.msg_id, m.correl_id, m.put_at, "
                "m.expiry_at, m.backout_count, m.md, m.body, m.body_id, b.data "
                "FROM messages m LEFT JOIN bodies b ON b.id = m.body_id ORDER BY m.seq"
            ).fetchall()
        shared: dict[int, bytes] = {}
        out: list[StoredMessage] = []
        for seq, queue, prio, msg_id, correl_id, put_at, expiry_at, backouts, md, body, \
                body_id, data in rows:
            if body_id is not None:
                if data is None:
                    raise StoreError(
                        f"{self.directory / DB_FILE}: message {seq} refers to body "
                        f"{body_id}, which is missing (damaged store)"
                    )
                body = shared.setdefault(body_id, data)
            out.append(StoredMessage(seq, queue, prio, msg_id, correl_id, put_at, expiry_at,
                                     backouts, md, body))
        return out

    def max_seq(self) -> int:
        with self._mutex:
            row = self._db.execute("SELECT MAX(seq) FROM messages").fetchone()
        return int(row[0] or 0)

    def apply(
        self,
        inserts: Sequence[StoredMessage] = (),
        deletes: Iterable[int] = (),
        backouts: Iterable[tuple[int, int]] = (),
        syncs: Iterable[ChannelSync] = (),
    ) -> None:
        """One durable transaction: add ``inserts``, remove ``deletes`` (seqs), set
        backout counts ``(seq, count)``, record channel batches ``syncs``. Returns only
        after the WAL is on disk. A body object inserted more than once is stored once
        (see the module docstring).

        A transaction without inserts that fails because the disk is full releases the
        store reserve and is tried once more (:mod:`.space`): the commits that free
        space must not need any."""
        with self._mutex:
            try:
                self._apply_locked(inserts, deletes, backouts, syncs)
            except sqlite3.OperationalError as exc:
                if inserts or not _disk_full(exc) or not self.space.release_reserve():
                    raise
                self._apply_locked(inserts, deletes, backouts, syncs)
            space = self.space
            if space.enabled and (
                space.due() or space.wrote(sum(len(m.body) for m in inserts), len(inserts))
            ):
                space.measure(self._free_pages_bytes())
                if not space.low:
                    space.make_reserve()

    def _free_pages_bytes(self) -> int:
        """Bytes of the store's free pages (reused by new rows before the file grows)."""
        try:
            return int(self._db.execute("PRAGMA freelist_count").fetchone()[0]) * self._page_size
        except sqlite3.Error:
            return 0

    def _apply_locked(
        self,
        inserts: Sequence[StoredMessage],
        deletes: Iterable[int],
        backouts: Iterable[tuple[int, int]],
        syncs: Iterable[ChannelSync],
    ) -> None:
        with self._transaction():
            sync_rows = [(s.channel, s.batch_seq, s.msg_ids) for s in syncs]
            if sync_rows:
                self._db.executemany(
                    "INSERT OR REPLACE INTO channel_sync (channel, batch_seq, msg_ids) "
                    "VALUES (?, ?, ?)",
                    sync_rows,
                )
            if inserts:
                body_ids = self._shared_bodies(inserts)
                values: list[object] = []
                add = values.extend
                for m in inserts:
                    ref = body_ids.get(id(m.body))
                    add((m.seq, m.queue, m.priority, m.msg_id, m.correl_id, m.put_at,
                         m.expiry_at, m.backout_count, m.md,
                         m.body if ref is None else b"", ref))
                for start, rows in insert_chunks(len(inserts), self._insert_rows):
                    self._db.execute(_insert_statement(rows),
                                     values[start * _COLUMNS : (start + rows) * _COLUMNS])
            seqs = list(deletes)
            for start in range(0, len(seqs), _MAX_VARIABLES):
                these = seqs[start : start + _MAX_VARIABLES]
                self._db.execute(_delete_statement(len(these)), these)
            counts = [(count, seq) for seq, count in backouts]
            if counts:
                self._db.executemany("UPDATE messages SET backout_count=? WHERE seq=?", counts)

    def _shared_bodies(self, inserts: Sequence[StoredMessage]) -> dict[int, int]:
        """Store once each body object that ``inserts`` carry at least twice and that is
        at least ``SHARED_BODY_MIN`` bytes long: ``id(body)`` -> its ``bodies`` row.
        By identity, not value: the fan-out hands the same object to every put, and
        ``inserts`` keeps each object alive for the whole transaction."""
        counts: dict[int, int] = {}
        for m in inserts:
            if len(m.body) >= SHARED_BODY_MIN:
                k = id(m.body)
                counts[k] = counts.get(k, 0) + 1
        if not counts or max(counts.values()) < 2:
            return {}
        bodies = {id(m.body): m.body for m in inserts if counts.get(id(m.body), 0) > 1}
        out: dict[int, int] = {}
        for k, body in bodies.items():
            cur = self._db.execute(
                "INSERT INTO bodies (refs, data) VALUES (?, ?)", (counts[k], body)
            )
            assert cur.lastrowid is not None
            out[k] = cur.lastrowid
        return out

    def purge_queue(self, name: str) -> None:
        with self._mutex, self._transaction():
            self._db.execute("DELETE FROM messages WHERE queue=?", (name,))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._mutex:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.close()
        os.close(self._lock_fd)

    # ------------------------------------------------------------------ internals

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


#: Bound values per statement: SQLite's limit before 3.32 (32,766 since).
_MAX_VARIABLES = 999
#: Values per message row.
_COLUMNS = 11
#: At most this many message rows per INSERT statement (22,528 values), where the
#: library allows as many values (:func:`rows_per_insert`).
INSERT_ROWS_MAX = 2048
_INSERT_COLUMNS = (
    "INSERT INTO messages (seq, queue, priority, msg_id, correl_id, put_at, expiry_at, "
    "backout_count, md, body, body_id) VALUES "
)


def rows_per_insert(max_variables: int) -> int:
    """The largest power of two of message rows whose values fit ``max_variables``
    (the connection's SQLITE_LIMIT_VARIABLE_NUMBER), at most ``INSERT_ROWS_MAX``."""
    fits = max(1, min(max_variables // _COLUMNS, INSERT_ROWS_MAX))
    return 1 << (fits.bit_length() - 1)


def insert_chunks(count: int, largest: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of the INSERT statements that write ``count`` rows:
    statements of ``largest`` rows (a power of two), then the rest in falling powers of
    two. So a transaction of a fan-out's 2,000 rows is 6 statements, and only
    log2(``largest``) + 1 different statement texts ever exist: each is compiled once
    and kept in the connection's statement cache (compiling a statement costs about as
    much as running it)."""
    out: list[tuple[int, int]] = []
    start = 0
    size = largest
    while start < count:
        while size > count - start:
            size >>= 1
        out.append((start, size))
        start += size
    return out


@functools.lru_cache(maxsize=INSERT_ROWS_MAX.bit_length())
def _insert_statement(rows: int) -> str:
    """An INSERT of ``rows`` message rows.

    Why whole statements, not ``executemany``: SQLite runs each row as one step, and
    Python's sqlite3 gives the GIL up for every step. The writer thread then needs the
    GIL back once per row, and while the event loop is busy it gets it only every
    switch interval, so a unit of work of a few hundred messages took as long to write
    as the loop's next batch took to work (docs/performance.md, "Commits overlapped
    with the next batch"). The same holds per statement: a fan-out's unit of work of
    2,000 rows took 23 statements of 90 rows (the 999-value limit of SQLite before
    3.32), and its write waited for the GIL about as long as it ran; statements as
    large as the library allows (:func:`insert_chunks`) keep it to a few per
    transaction.
    """
    return _INSERT_COLUMNS + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * rows)


def _disk_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL: the file system had no room for the write."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code == sqlite3.SQLITE_FULL or (code is None and "full" in str(exc))


@functools.lru_cache(maxsize=64)
def _delete_statement(seqs: int) -> str:
    """A DELETE of ``seqs`` messages by sequence (see :func:`_insert_statement`)."""
    return f"DELETE FROM messages WHERE seq IN ({','.join(['?'] * seqs)})"


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                # a COMMIT that failed (disk full) may leave the transaction open
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        elif self._db.in_transaction:
            self._db.execute("ROLLBACK")


def dir_lock_owner(directory: Path) -> str | None:
    """Who holds ``directory``'s lock (``pid N``), None when nobody does. For a process
    that holds no store of ``directory`` itself (closing the probe would drop that lock)."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown pid"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _acquire_dir_lock(directory: Path) -> int:
    path = directory / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            owner = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown pid"
        finally:
            os.close(fd)
        raise DataDirInUseError(directory, owner) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    os.fsync(fd)
    return fd
