"""The durable store: SQLite in WAL mode, one transaction per applied batch.

Why SQLite: a single file next to the queue manager's data, atomic multi-row commits,
crash safety without a server. Rows are upserted by their identity (``INSERT ... ON
CONFLICT DO UPDATE``), so applying the same batch twice leaves the same state — the
property the service relies on when a crash falls between the store commit and the MQ
commit. The command journal keeps the newest ``journal_limit`` results.

Writes run on one writer thread, in submission order: :meth:`SqliteStore.apply_async`
lets the event loop run while SQLite commits (an fsync, 5-56 ms per batch), and the
blocking :meth:`SqliteStore.apply` goes through the same thread, so batches are never
reordered whichever way they are applied.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gateway.pubsub.errors import StoreError
from gateway.pubsub.records import (
    Destination,
    Publication,
    Publisher,
    RetainedPublication,
    SubFormat,
    Subscription,
)
from gateway.pubsub.store import (
    DeletePublisher,
    DeleteRetained,
    DeleteSubscription,
    Mutation,
    PutRetained,
    RecordCommand,
    SettleRetained,
    StoreSnapshot,
    UpsertPublisher,
    UpsertSubscription,
)
from gateway.pubsub.topics import Scheme
from gateway.wire.reasons import Reason

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    stream TEXT NOT NULL, scheme INTEGER NOT NULL, topic TEXT NOT NULL,
    q_mgr TEXT NOT NULL, queue TEXT NOT NULL, sink TEXT NOT NULL, correl_id BLOB NOT NULL,
    fmt INTEGER NOT NULL, reg_opts INTEGER NOT NULL, sub_name TEXT NOT NULL,
    sub_identity TEXT NOT NULL, sub_user_data TEXT NOT NULL, user_identifier TEXT NOT NULL,
    accounting_token BLOB NOT NULL, appl_identity_data TEXT NOT NULL, created REAL NOT NULL,
    expires_at REAL NOT NULL DEFAULT 0, suspended INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, scheme, topic, q_mgr, queue, sink, correl_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS publishers (
    stream TEXT NOT NULL, topic TEXT NOT NULL, q_mgr TEXT NOT NULL, queue TEXT NOT NULL,
    correl_id BLOB NOT NULL, reg_opts INTEGER NOT NULL,
    PRIMARY KEY (stream, topic, q_mgr, queue, correl_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained (
    stream TEXT NOT NULL, topic TEXT NOT NULL, meta TEXT NOT NULL, payload BLOB NOT NULL,
    stored_at REAL NOT NULL, unsettled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (stream, topic)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL, msg_id BLOB NOT NULL,
    comp_code INTEGER NOT NULL, reason INTEGER NOT NULL, UNIQUE (queue, msg_id)
);
"""


def _add_suspended_column(db: sqlite3.Connection) -> None:
    """Stores written before subscriptions could be suspended lack the column."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(subscriptions)")}
    if "suspended" not in columns:
        db.execute("ALTER TABLE subscriptions ADD COLUMN suspended INTEGER NOT NULL DEFAULT 0")


def _add_unsettled_column(db: sqlite3.Connection) -> None:
    """Stores written before neighbours' retained copies were settled lack the column
    (their copies count as settled, as they were taken then)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(retained)")}
    if "unsettled" not in columns:
        db.execute("ALTER TABLE retained ADD COLUMN unsettled INTEGER NOT NULL DEFAULT 0")


def _publication_meta(p: Publication) -> str:
    return json.dumps(
        {
            "stream": p.stream,
            "topics": p.topics,
            "payload_format": p.payload_format,
            "payload_encoding": p.payload_encoding,
            "payload_ccsid": p.payload_ccsid,
            "persistence": p.persistence,
            "priority": p.priority,
            "expiry": p.expiry,
            "pub_opts": p.pub_opts,
            "pub_time": p.pub_time,
            "seq_num": p.seq_num,
            "int_data": p.int_data,
            "string_data": p.string_data,
            "user_pairs": p.user_pairs,
            "extra_folders": p.extra_folders,
            "publisher_q_mgr": p.publisher_q_mgr,
            "publisher_queue": p.publisher_queue,
            "direct_requests": p.direct_requests,
            "local": p.local,
            "origin": p.origin,
            "put_date": p.put_date,
            "put_time": p.put_time,
            "msg_id": p.msg_id.hex(),
            "correl_id": p.correl_id.hex(),
            "user_identifier": p.user_identifier,
            "header": p.header,
        }
    )


def _publication_from(meta: str, payload: bytes) -> Publication:
    d: dict[str, Any] = json.loads(meta)
    d["user_pairs"] = [(str(a), str(b)) for a, b in d.get("user_pairs", [])]
    for name in ("msg_id", "correl_id"):
        d[name] = bytes.fromhex(d.get(name, ""))
    return Publication(payload=payload, **d)


class SqliteStore:
    """A :class:`~gateway.pubsub.store.PubSubStore` in one SQLite file.

    ``synchronous`` is SQLite's PRAGMA: ``FULL`` (default) survives power loss, ``NORMAL``
    survives a process crash (SIGKILL) and is faster.
    """

    def __init__(
        self, path: str | Path, *, synchronous: str = "FULL", journal_limit: int = 100_000
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}")
        self.path = Path(path)
        self.journal_limit = journal_limit
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.executescript(_SCHEMA)
            _add_suspended_column(self._db)
            _add_unsettled_column(self._db)
            # journal reads on the event loop: a WAL reader of its own, never waiting
            # for the writer thread's BEGIN...COMMIT and fsync (it sees committed data)
            self._reader = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False
            )
            self._reader.execute("PRAGMA query_only=ON")
        except sqlite3.Error as exc:
            raise StoreError(Reason.COMMAND_FAILED, f"cannot open {self.path}: {exc}") from exc
        self._batches = 0
        #: the connection is used by the writer thread and (reads) the caller's
        self._mutex = threading.Lock()
        self._read_mutex = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pubsub-store")

    def load(self) -> StoreSnapshot:
        with self._mutex:
            return self._load()

    def _load(self) -> StoreSnapshot:
        snap = StoreSnapshot()
        try:
            for row in self._db.execute(
                "SELECT stream, scheme, topic, q_mgr, queue, sink, correl_id, fmt, reg_opts,"
                " sub_name, sub_identity, sub_user_data, user_identifier, accounting_token,"
                " appl_identity_data, created, expires_at, suspended FROM subscriptions"
            ):
                snap.subscriptions.append(
                    Subscription(
                        stream=row[0],
                        scheme=Scheme(row[1]),
                        topic=row[2],
                        destination=Destination(row[3], row[4], row[5]),
                        correl_id=bytes(row[6]),
                        fmt=SubFormat(row[7]),
                        reg_opts=row[8],
                        sub_name=row[9],
                        sub_identity=row[10],
                        sub_user_data=row[11],
                        user_identifier=row[12],
                        accounting_token=bytes(row[13]),
                        appl_identity_data=row[14],
                        created=row[15],
                        expires_at=row[16],
                        suspended=bool(row[17]),
                    )
                )
            for row in self._db.execute(
                "SELECT stream, topic, q_mgr, queue, correl_id, reg_opts FROM publishers"
            ):
                snap.publishers.append(
                    Publisher(row[0], row[1], row[2], row[3], bytes(row[4]), row[5])
                )
            for row in self._db.execute(
                "SELECT stream, topic, meta, payload, stored_at, unsettled FROM retained"
            ):
                snap.retained.append(
                    RetainedPublication(
                        row[0], row[1], _publication_from(row[2], bytes(row[3])), row[4],
                        row[5],
                    )
                )
        except sqlite3.Error as exc:
            raise StoreError(Reason.COMMAND_FAILED, f"cannot read {self.path}: {exc}") from exc
        return snap

    def apply(self, mutations: Sequence[Mutation]) -> None:
        """One atomic batch, on disk when this returns (blocks the caller)."""
        if not mutations:
            return
        self._writer.submit(self._apply_now, list(mutations)).result()

    async def apply_async(self, mutations: Sequence[Mutation]) -> None:
        """:meth:`apply` without blocking the event loop: the batch is on disk when the
        await returns (after every batch submitted before it).

        Once submitted, the batch is written whatever happens to the awaiting task: a
        cancellation waits for the write to finish and is raised only after it, so a
        ``CancelledError`` from here means the batch is on disk (a failed write raises
        its :class:`StoreError` instead, also when cancelled meanwhile)."""
        if not mutations:
            return
        fut = asyncio.wrap_future(self._writer.submit(self._apply_now, list(mutations)))
        interrupted = False
        while not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                if fut.cancelled():  # the writer stopped before running it: not written
                    raise StoreError(
                        Reason.COMMAND_FAILED, f"{self.path}: the writer stopped"
                    ) from None
                interrupted = True  # the write goes on: wait for it, then re-raise
        if fut.cancelled():
            raise StoreError(Reason.COMMAND_FAILED, f"{self.path}: the writer stopped")
        fut.result()  # a failed write raises here
        if interrupted:
            raise asyncio.CancelledError

    def _apply_now(self, mutations: Sequence[Mutation]) -> None:
        with self._mutex:
            self._apply_locked(mutations)

    def _apply_locked(self, mutations: Sequence[Mutation]) -> None:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for m in mutations:
                self._apply_one(db, m)
            self._batches += 1
            if self._batches % 1000 == 0:
                db.execute(
                    "DELETE FROM journal WHERE seq <= (SELECT MAX(seq) FROM journal) - ?",
                    (self.journal_limit,),
                )
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise StoreError(Reason.COMMAND_FAILED, f"cannot write {self.path}: {exc}") from exc

    @staticmethod
    def _apply_one(db: sqlite3.Connection, m: Mutation) -> None:
        if isinstance(m, UpsertSubscription):
            s = m.subscription
            d = s.destination
            db.execute(
                "INSERT INTO subscriptions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT DO UPDATE SET fmt=excluded.fmt, reg_opts=excluded.reg_opts,"
                " sub_name=excluded.sub_name, sub_identity=excluded.sub_identity,"
                " sub_user_data=excluded.sub_user_data, user_identifier=excluded.user_identifier,"
                " accounting_token=excluded.accounting_token,"
                " appl_identity_data=excluded.appl_identity_data,"
                " expires_at=excluded.expires_at, suspended=excluded.suspended",
                (
                    s.stream,
                    int(s.scheme),
                    s.topic,
                    d.q_mgr,
                    d.queue,
                    d.sink,
                    s.correl_id,
                    int(s.fmt),
                    s.reg_opts,
                    s.sub_name,
                    s.sub_identity,
                    s.sub_user_data,
                    s.user_identifier,
                    s.accounting_token,
                    s.appl_identity_data,
                    s.created,
                    s.expires_at,
                    int(s.suspended),
                ),
            )
        elif isinstance(m, DeleteSubscription):
            db.execute(
                "DELETE FROM subscriptions WHERE stream=? AND scheme=? AND topic=? AND q_mgr=?"
                " AND queue=? AND sink=? AND correl_id=?",
                m.key,
            )
        elif isinstance(m, UpsertPublisher):
            p = m.publisher
            db.execute(
                "INSERT INTO publishers VALUES (?,?,?,?,?,?)"
                " ON CONFLICT DO UPDATE SET reg_opts=excluded.reg_opts",
                (p.stream, p.topic, p.q_mgr, p.queue, p.correl_id, p.reg_opts),
            )
        elif isinstance(m, DeletePublisher):
            db.execute(
                "DELETE FROM publishers WHERE stream=? AND topic=? AND q_mgr=? AND queue=?"
                " AND correl_id=?",
                m.key,
            )
        elif isinstance(m, PutRetained):
            r = m.retained
            db.execute(
                "INSERT INTO retained VALUES (?,?,?,?,?,?) ON CONFLICT DO UPDATE SET"
                " meta=excluded.meta, payload=excluded.payload, stored_at=excluded.stored_at,"
                " unsettled=excluded.unsettled",
                (
                    r.stream,
                    r.topic,
                    _publication_meta(r.publication),
                    r.publication.payload,
                    r.stored_at,
                    r.unsettled,
                ),
            )
        elif isinstance(m, DeleteRetained):
            db.execute("DELETE FROM retained WHERE stream=? AND topic=?", (m.stream, m.topic))
        elif isinstance(m, SettleRetained):
            db.execute(
                "UPDATE retained SET unsettled=0 WHERE stream=? AND topic=? AND unsettled=?",
                (m.stream, m.topic, m.token),
            )
        elif isinstance(m, RecordCommand):
            db.execute(
                "INSERT INTO journal (queue, msg_id, comp_code, reason) VALUES (?,?,?,?)"
                " ON CONFLICT DO UPDATE SET comp_code=excluded.comp_code, reason=excluded.reason",
                (m.queue, m.msg_id, m.comp_code, m.reason),
            )

    def recorded_result(self, queue: str, msg_id: bytes) -> tuple[int, int] | None:
        """The journalled result of a command (committed batches only), on the reader
        connection: a commit in flight on the writer thread does not hold it up."""
        try:
            with self._read_mutex:
                row = self._reader.execute(
                    "SELECT comp_code, reason FROM journal WHERE queue=? AND msg_id=?",
                    (queue, msg_id),
                ).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(Reason.COMMAND_FAILED, f"cannot read {self.path}: {exc}") from exc
        return None if row is None else (int(row[0]), int(row[1]))

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        with self._read_mutex:
            self._reader.close()
        with self._mutex:
            self._db.close()
