"""What the gateway knows about its neighbours, durably: ``neighbours.db`` (SQLite).

Why a database and not memory: the proxy subscriptions registered at a neighbour must
survive a SIGKILL, or a restart would register them again (harmless: RegSub is
idempotent) or, worse, never withdraw them (a leak at the neighbour for ever). So every
RegSub/DeregSub is written here as an *intent* (a row per topic, with the command's
MsgId: the topics of one command share it) before its put is committed; a row whose
command was not acknowledged yet is sent again at start, and the neighbour's response
(CorrelId = that MsgId) settles it. It is also the channel from
the ``mqgw neighbours`` CLI to a running gateway: the CLI writes a join or clear request,
the running links pick it up within a second; ``list`` reads it whether or not anything
runs.

A RegSub the neighbour refused keeps its row, with the reason and a backoff (60 s
doubling to 10 min) before it is sent again, so ``list`` shows it and a refusal is not
answered by the same RegSub at once, over and over.

The schema is versioned with ``PRAGMA user_version``; a newer file is refused, an older
one is brought up to date.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.pubsub.neighbours import Neighbour, NeighbourKind, NeighbourRole, ProxyKey
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.neighbours.config import NeighbourConfig

__all__ = [
    "DB_NAME",
    "SCHEMA_VERSION",
    "LinkState",
    "NeighbourRow",
    "NeighbourState",
    "NeighbourStateError",
    "ProxyRow",
    "neighbours_db_of",
]

SCHEMA_VERSION = 2
#: Backoff of a refused RegSub: first wait, doubled per refusal up to the last (s).
REFUSED_BACKOFF_FIRST = 60.0
REFUSED_BACKOFF_MAX = 600.0
DB_NAME = "neighbours.db"
LinkState = Literal["joining", "active", "inactive", "refused"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS neighbours (
    q_mgr TEXT PRIMARY KEY, kind TEXT NOT NULL, role TEXT NOT NULL,
    configured_streams TEXT, learnt_streams TEXT,
    state TEXT NOT NULL, refusal TEXT NOT NULL DEFAULT '',
    last_heard REAL NOT NULL DEFAULT 0, joined_at REAL NOT NULL,
    probe_timeout REAL NOT NULL DEFAULT 5.0,
    clear_requested INTEGER NOT NULL DEFAULT 0, last_error TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS proxies (
    q_mgr TEXT NOT NULL, stream TEXT NOT NULL, topic TEXT NOT NULL, scheme INTEGER NOT NULL,
    msg_id BLOB NOT NULL, acknowledged INTEGER NOT NULL DEFAULT 0,
    withdrawing INTEGER NOT NULL DEFAULT 0,
    refused TEXT NOT NULL DEFAULT '', backoff REAL NOT NULL DEFAULT 0,
    retry_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (q_mgr, stream, topic, scheme)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS proxies_by_msg_id ON proxies (msg_id);
"""
#: Version 1 -> 2: the refusal of a RegSub is kept.
_UPGRADE_1 = (
    "ALTER TABLE proxies ADD COLUMN refused TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE proxies ADD COLUMN backoff REAL NOT NULL DEFAULT 0",
    "ALTER TABLE proxies ADD COLUMN retry_at REAL NOT NULL DEFAULT 0",
)


class NeighbourStateError(Exception):
    """The neighbours database cannot be used (a newer schema, a broken file)."""


@dataclass(frozen=True, slots=True)
class NeighbourRow:
    """One neighbour as remembered (``list`` prints these)."""

    q_mgr: str
    kind: NeighbourKind
    role: NeighbourRole
    configured_streams: tuple[str, ...] | None
    learnt_streams: tuple[str, ...] | None
    state: LinkState
    refusal: str
    last_heard: float
    joined_at: float
    probe_timeout: float
    clear_requested: bool
    #: The last refusal of one of our commands by this neighbour (reason and text).
    last_error: str = ""

    @property
    def common_streams(self) -> frozenset[str]:
        """Streams both sides support (net13-spec "Negotiation"): configured ∩ learnt,
        or whichever of the two is known, always with the default stream."""
        if self.configured_streams is None and self.learnt_streams is None:
            streams: set[str] = set()
        elif self.configured_streams is None:
            streams = set(self.learnt_streams or ())
        elif self.learnt_streams is None:
            streams = set(self.configured_streams)
        else:
            streams = set(self.configured_streams) & set(self.learnt_streams)
        return frozenset(streams | {DEFAULT_STREAM})

    @property
    def neighbour(self) -> Neighbour:
        """The neighbour as the engine and the command builders know it."""
        return Neighbour(self.q_mgr, self.kind, self.role, self.common_streams)

    def configured_as(self, cfg: NeighbourConfig) -> bool:
        """True when ``cfg`` says what this row was joined with (no new join due)."""
        streams = None if cfg.streams is None else tuple(cfg.streams)
        return (self.kind, self.role, self.configured_streams, self.probe_timeout) == (
            cfg.kind,
            cfg.role,
            streams,
            cfg.probe_timeout,
        )


@dataclass(frozen=True, slots=True)
class ProxyRow:
    """A proxy subscription registered (or being withdrawn) at a neighbour."""

    q_mgr: str
    key: ProxyKey
    msg_id: bytes
    acknowledged: bool
    withdrawing: bool
    #: why the neighbour refused this RegSub ("" when it did not)
    refused: str = ""
    #: the current backoff and when the refused RegSub is sent again (epoch seconds)
    backoff: float = 0.0
    retry_at: float = 0.0


def neighbours_db_of(pubsub_store: Path) -> Path:
    """``neighbours.db`` lives next to the pub/sub store (same data directory)."""
    return pubsub_store.parent / DB_NAME


def _streams(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise NeighbourStateError(f"a stream list in neighbours.db is not JSON: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise NeighbourStateError("a stream list in neighbours.db is not a list of names")
    return tuple(value)


def _text(streams: Iterable[str] | None) -> str | None:
    return None if streams is None else json.dumps(sorted(set(streams)))


class NeighbourState:
    """The neighbours database (see module docstring); one per data directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                db.close()
                raise NeighbourStateError(
                    f"{path} has neighbours schema version {version}; this gateway knows "
                    f"up to {SCHEMA_VERSION} (a newer gateway wrote it)"
                )
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: an intent must be on disk before the command's put is committed.
            db.execute("PRAGMA synchronous=FULL")
            with db:
                if version == 1:
                    for statement in _UPGRADE_1:
                        db.execute(statement)
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise NeighbourStateError(f"cannot open {path}: {exc}") from exc
        self._db = db
        try:
            self._load_proxies()
        except sqlite3.Error as exc:
            db.close()
            raise NeighbourStateError(f"cannot read {path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction, one fsync, however many statements: the connection is in
        autocommit mode (``isolation_level=None``), where ``with connection:`` begins
        nothing and each statement of an ``executemany`` would commit (and fsync) on
        its own."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.rollback()
            raise
        self._db.commit()

    # ------------------------------------------------------------- neighbours -----

    def request_join(self, cfg: NeighbourConfig, now: float) -> NeighbourRow:
        """Remember ``cfg`` as a neighbour to join (state ``joining``); joining again
        restarts the negotiation and keeps the registered proxies."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO neighbours (q_mgr, kind, role, configured_streams, state, "
                "joined_at, probe_timeout) VALUES (?, ?, ?, ?, 'joining', ?, ?) "
                "ON CONFLICT(q_mgr) DO UPDATE SET kind = excluded.kind, role = excluded.role, "
                "configured_streams = excluded.configured_streams, state = 'joining', "
                "refusal = '', probe_timeout = excluded.probe_timeout, clear_requested = 0, "
                "last_error = ''",
                (
                    cfg.q_mgr,
                    str(cfg.kind),
                    str(cfg.role),
                    _text(cfg.streams),
                    now,
                    cfg.probe_timeout,
                ),
            )
        row = self.neighbour(cfg.q_mgr)
        assert row is not None
        return row

    def request_clear(self, q_mgr: str) -> bool:
        """Ask the running links to clear ``q_mgr`` (False: no such neighbour)."""
        with self._transaction():
            cur = self._db.execute(
                "UPDATE neighbours SET clear_requested = 1 WHERE q_mgr = ?", (q_mgr,)
            )
        return cur.rowcount > 0

    def neighbours(self) -> list[NeighbourRow]:
        rows = self._db.execute(
            "SELECT q_mgr, kind, role, configured_streams, learnt_streams, state, refusal, "
            "last_heard, joined_at, probe_timeout, clear_requested, last_error FROM neighbours "
            "ORDER BY q_mgr"
        ).fetchall()
        return [
            NeighbourRow(
                r[0],
                NeighbourKind(r[1]),
                NeighbourRole(r[2]),
                _streams(r[3]),
                _streams(r[4]),
                r[5],
                r[6],
                float(r[7]),
                float(r[8]),
                float(r[9]),
                bool(r[10]),
                r[11],
            )
            for r in rows
        ]

    def neighbour(self, q_mgr: str) -> NeighbourRow | None:
        for row in self.neighbours():
            if row.q_mgr == q_mgr:
                return row
        return None

    def set_state(self, q_mgr: str, state: LinkState, refusal: str = "") -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE neighbours SET state = ?, refusal = ? WHERE q_mgr = ?",
                (state, refusal, q_mgr),
            )

    def set_last_error(self, q_mgr: str, text: str) -> None:
        with self._transaction():
            self._db.execute("UPDATE neighbours SET last_error = ? WHERE q_mgr = ?", (text, q_mgr))

    def set_learnt_streams(self, q_mgr: str, streams: Iterable[str]) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE neighbours SET learnt_streams = ? WHERE q_mgr = ?",
                (_text(streams), q_mgr),
            )

    def heard(self, q_mgr: str, when: float) -> bool:
        """``q_mgr`` sent us something at ``when``; False when it is no neighbour."""
        with self._transaction():
            cur = self._db.execute(
                "UPDATE neighbours SET last_heard = max(last_heard, ?) WHERE q_mgr = ?",
                (when, q_mgr),
            )
        return cur.rowcount > 0

    def forget(self, q_mgr: str) -> None:
        """Drop the neighbour and every proxy row of it (after clear)."""
        with self._transaction():
            self._db.execute("DELETE FROM proxies WHERE q_mgr = ?", (q_mgr,))
            self._db.execute("DELETE FROM neighbours WHERE q_mgr = ?", (q_mgr,))
        for where in [w for w in self._proxy_rows if w[0] == q_mgr]:
            self._forget_row(where)

    # ---------------------------------------------------------------- proxies -----
    #
    # The proxy rows are mirrored in memory (only the links of the process that owns the
    # data directory write them): the links read them on every sync, and reading
    # thousands of rows from SQLite per sync made registering N proxies cost O(N^2).

    def _load_proxies(self) -> None:
        #: counts rows added or removed and withdrawals begun (what a proxy diff reads)
        self.proxies_revision = 0
        self._proxy_rows: dict[tuple[str, ProxyKey], ProxyRow] = {}
        #: the rows each command covers (a proxy command may carry several topics)
        self._by_msg_id: dict[bytes, dict[tuple[str, ProxyKey], None]] = {}
        self._unsettled: set[tuple[str, ProxyKey]] = set()
        for row in self._proxies_where("1", ()):
            self._remember(row)

    def _remember(self, row: ProxyRow) -> None:
        where = (row.q_mgr, row.key)
        old = self._proxy_rows.get(where)
        if old is None or old.withdrawing != row.withdrawing:
            self.proxies_revision += 1
        if old is not None:
            self._unlink(old.msg_id, where)
        self._proxy_rows[where] = row
        self._by_msg_id.setdefault(row.msg_id, {})[where] = None
        if row.acknowledged:
            self._unsettled.discard(where)
        else:
            self._unsettled.add(where)

    def _forget_row(self, where: tuple[str, ProxyKey]) -> None:
        row = self._proxy_rows.pop(where, None)
        self.proxies_revision += 1
        if row is not None:
            self._unlink(row.msg_id, where)
        self._unsettled.discard(where)

    def _unlink(self, msg_id: bytes, where: tuple[str, ProxyKey]) -> None:
        covered = self._by_msg_id.get(msg_id)
        if covered is not None:
            covered.pop(where, None)
            if not covered:
                del self._by_msg_id[msg_id]

    def drop_proxies(self, q_mgr: str) -> None:
        """Forget every proxy row of ``q_mgr`` (their DeregSubs are put: refusal)."""
        with self._transaction():
            self._db.execute("DELETE FROM proxies WHERE q_mgr = ?", (q_mgr,))
        for where in [w for w in self._proxy_rows if w[0] == q_mgr]:
            self._forget_row(where)

    def proxies(self, q_mgr: str | None = None) -> list[ProxyRow]:
        """The proxy rows (of ``q_mgr``), in (q_mgr, stream, topic, scheme) order."""
        rows = [r for (q, _), r in self._proxy_rows.items() if q_mgr is None or q == q_mgr]
        rows.sort(key=lambda r: (r.q_mgr, r.key))
        return rows

    def proxy_map(self, q_mgr: str) -> dict[ProxyKey, ProxyRow]:
        """The proxy rows of ``q_mgr`` by key (unordered, no copy of the rows)."""
        return {k: r for (q, k), r in self._proxy_rows.items() if q == q_mgr}

    def unsettled_proxies(self) -> list[ProxyRow]:
        """The rows whose command no response has settled yet (O(their number))."""
        return [self._proxy_rows[w] for w in self._unsettled]

    @property
    def unsettled_count(self) -> int:
        return len(self._unsettled)

    def intend(self, q_mgr: str, key: ProxyKey, msg_id: bytes, *, register: bool) -> None:
        """Record a RegSub (``register``) or DeregSub about to be put with ``msg_id``;
        durable before this returns (call it before committing the put)."""
        self.intend_many([(q_mgr, key, msg_id, register)])

    def intend_many(self, intents: Iterable[tuple[str, ProxyKey, bytes, bool]]) -> None:
        """:meth:`intend` for many commands in one transaction (one fsync per sync,
        not one per proxy)."""
        rows = [
            ProxyRow(q_mgr, key, msg_id, False, not register)
            for q_mgr, key, msg_id, register in intents
        ]
        if not rows:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT INTO proxies (q_mgr, stream, topic, scheme, msg_id, acknowledged, "
                "withdrawing) VALUES (?, ?, ?, ?, ?, 0, ?) ON CONFLICT DO UPDATE SET "
                "msg_id = excluded.msg_id, acknowledged = 0, withdrawing = excluded.withdrawing",
                [
                    (r.q_mgr, r.key.stream, r.key.topic, r.key.scheme, r.msg_id, int(r.withdrawing))
                    for r in rows
                ],
            )
        for r in rows:
            old = self._proxy_rows.get((r.q_mgr, r.key))
            if old is not None:  # the refusal and its backoff stay (as the UPDATE keeps them)
                r = ProxyRow(r.q_mgr, r.key, r.msg_id, False, r.withdrawing, old.refused,
                             old.backoff, old.retry_at)
            self._remember(r)

    def command_rows(self, msg_id: bytes) -> list[ProxyRow]:
        """The rows the command ``msg_id`` covers and still waits for, in key order."""
        covered = self._by_msg_id.get(msg_id, {})
        rows = [self._proxy_rows[w] for w in covered if not self._proxy_rows[w].acknowledged]
        rows.sort(key=lambda r: r.key)
        return rows

    def settle(
        self, msg_id: bytes, ok: bool, *, reason: str = "", now: float = 0.0
    ) -> ProxyRow | None:
        """:meth:`settle_all` for a command of one topic: its row as it was, or None."""
        rows = self.settle_all(msg_id, ok, reason=reason, now=now)
        return rows[0] if rows else None

    def settle_all(
        self, msg_id: bytes, ok: bool, *, reason: str = "", now: float = 0.0
    ) -> list[ProxyRow]:
        """The neighbour answered the command ``msg_id``: a RegSub's rows are
        acknowledged, a DeregSub's rows go (also when it failed: the neighbour has no
        such subscription). A failed RegSub's rows stay, refused with ``reason``, sent
        again after their backoff (module docstring). One transaction for every row the
        command covers. Returns the rows as they were (none when ``msg_id`` is no
        pending proxy command)."""
        rows = self.command_rows(msg_id)
        if not rows:
            return []
        with self._transaction():
            if rows[0].withdrawing:
                self._db.execute(
                    "DELETE FROM proxies WHERE msg_id = ? AND acknowledged = 0", (msg_id,)
                )
                for row in rows:
                    self._forget_row((row.q_mgr, row.key))
            elif not ok:
                for row in rows:
                    backoff = min(
                        max(REFUSED_BACKOFF_FIRST, 2 * row.backoff), REFUSED_BACKOFF_MAX
                    )
                    self._db.execute(
                        "UPDATE proxies SET refused = ?, backoff = ?, retry_at = ? "
                        "WHERE q_mgr = ? AND stream = ? AND topic = ? AND scheme = ? "
                        "AND msg_id = ?",
                        (reason or "refused", backoff, now + backoff, row.q_mgr,
                         row.key.stream, row.key.topic, row.key.scheme, msg_id),
                    )
                    self._remember(dataclasses.replace(
                        row, refused=reason or "refused", backoff=backoff,
                        retry_at=now + backoff,
                    ))
            else:
                self._db.execute(
                    "UPDATE proxies SET acknowledged = 1, refused = '', backoff = 0, "
                    "retry_at = 0 WHERE msg_id = ?",
                    (msg_id,),
                )
                for row in rows:
                    self._remember(dataclasses.replace(
                        row, acknowledged=True, refused="", backoff=0.0, retry_at=0.0
                    ))
        return rows

    def _proxies_where(self, where: str, args: tuple[object, ...]) -> list[ProxyRow]:
        return [
            ProxyRow(
                r[0],
                ProxyKey(r[1], r[2], int(r[3])),
                bytes(r[4]),
                bool(r[5]),
                bool(r[6]),
                r[7],
                float(r[8]),
                float(r[9]),
            )
            for r in self._db.execute(
                "SELECT q_mgr, stream, topic, scheme, msg_id, acknowledged, withdrawing, "
                "refused, backoff, retry_at "
                f"FROM proxies WHERE {where} ORDER BY q_mgr, stream, topic, scheme",
                args,
            )
        ]
