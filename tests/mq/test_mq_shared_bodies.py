"""Shared bodies in the embedded queue manager's store (issue 16, fan-out pass 2).

One publication fanned out to many subscriber queues is many persistent messages with
the same body object; the store keeps that body once (``bodies``) and each message row
refers to it. What must hold: every message reads back with its own body, after a
restart too; the shared body goes away with the last message that refers to it (got,
purged, queue deleted), never before; a schema-1 data directory is upgraded in place
with its messages intact, a newer schema is refused; and a process killed at any moment
leaves either the whole unit of work or none of it, with every body present and no body
left behind (reference counts equal to the rows that refer to them).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.store import (
    DB_FILE,
    SCHEMA_VERSION,
    SHARED_BODY_MIN,
    MessageStore,
    StoredMessage,
    StoreError,
)
from gateway.mq.port import GetOptions, MQError, OpenOption, PutItem, PutOptions, put_many
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

SYNC = PutOptions(syncpoint=True, set_all_context=True)
BODY = bytes(range(256)) * 5  # 1,280 bytes: shared when put more than once


def mqsc_ok(qm: EmbeddedQueueManager, script: str) -> None:
    for r in qm.run_mqsc(script):
        assert r.ok, (r.line, r.text, r.lines)


def md_for(i: int) -> MQMD:
    return MQMD(persistence=Persistence.PERSISTENT, correl_id=b"SUB" + i.to_bytes(21, "big"))


def db_rows(directory: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(bodies ``(id, refs)``, messages ``(seq, body_id)`` that refer to one)."""
    db = sqlite3.connect(directory / DB_FILE)
    try:
        bodies = db.execute("SELECT id, refs FROM bodies ORDER BY id").fetchall()
        refs = db.execute(
            "SELECT seq, body_id FROM messages WHERE body_id IS NOT NULL ORDER BY seq"
        ).fetchall()
        return bodies, refs
    finally:
        db.close()


def consistent(directory: Path) -> None:
    """Every referred body exists; every body's refs is the number of rows referring."""
    bodies, refs = db_rows(directory)
    counts: dict[int, int] = {}
    for _, body_id in refs:
        counts[body_id] = counts.get(body_id, 0) + 1
    assert dict(bodies) == counts


async def get_all(qm: EmbeddedQueueManager, queue: str, limit: int = 0) -> list[bytes]:
    out: list[bytes] = []
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        while not limit or len(out) < limit:
            try:
                out.append((await h.get(GetOptions(wait_ms=0, syncpoint=True))).body)
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                break
        await conn.commit()
    return out


async def test_fan_out_stores_the_body_once_and_reads_it_back(tmp_path: Path) -> None:
    data = tmp_path / "qm"
    qm = EmbeddedQueueManager("QM1", data)
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)")
        other = b"y" * 300  # a second shared body in the same unit of work
        small = b"s" * (SHARED_BODY_MIN - 1)  # shared object, but too short to share
        items: list[PutItem] = [(f"SUB.{i % 2}", "", md_for(i), BODY) for i in range(40)]
        items += [("SUB.0", "", md_for(100 + i), other) for i in range(3)]
        items += [("SUB.1", "", md_for(200 + i), small) for i in range(3)]
        items += [("SUB.1", "", md_for(300), BODY[:-1] + BODY[-1:])]  # equal, not the same
        items += [("SUB.1", "", md_for(301), bytearray(b"z" * 400))]  # put makes it bytes
        async with await qm.connect() as conn:
            results = await put_many(conn, items, SYNC)
            assert all(isinstance(r, MQMD) for r in results)
            await conn.commit()
        bodies, refs = db_rows(data)
        assert sorted(r for _, r in bodies) == [3, 40]
        assert len(refs) == 43
        consistent(data)
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", data)  # restart: loaded from the store
    try:
        sub0, sub1 = await get_all(qm, "SUB.0"), await get_all(qm, "SUB.1")
        assert sub0 == [BODY] * 20 + [other] * 3
        assert sub1 == [BODY] * 20 + [small] * 3 + [BODY, b"z" * 400]
        assert db_rows(data) == ([], [])
    finally:
        await qm.close()


async def test_shared_body_lives_until_its_last_message_goes(tmp_path: Path) -> None:
    data = tmp_path / "qm"
    qm = EmbeddedQueueManager("QM1", data)
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)\nDEFINE QLOCAL(SUB.2)")
        items: list[PutItem] = [(f"SUB.{i % 3}", "", md_for(i), BODY) for i in range(30)]
        async with await qm.connect() as conn:
            await put_many(conn, items, SYNC)
            await conn.commit()
        assert [r for _, r in db_rows(data)[0]] == [30]
        # gets backed out leave it as it was
        async with await qm.connect() as conn:
            h = await conn.open("SUB.0", OpenOption.INPUT_SHARED)
            for _ in range(5):
                await h.get(GetOptions(wait_ms=0, syncpoint=True))
            await conn.backout()
        assert [r for _, r in db_rows(data)[0]] == [30]
        assert len(await get_all(qm, "SUB.0", limit=4)) == 4
        assert [r for _, r in db_rows(data)[0]] == [26]
        consistent(data)
        qm._store.purge_queue("SUB.1")  # the store's purge (no MQSC CLEAR yet)
        assert [r for _, r in db_rows(data)[0]] == [16]
        consistent(data)
        mqsc_ok(qm, "DELETE QLOCAL(SUB.2) PURGE")
        assert [r for _, r in db_rows(data)[0]] == [6]
        consistent(data)
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", data)
    try:
        assert await get_all(qm, "SUB.0") == [BODY] * 6
        assert await get_all(qm, "SUB.1") == []
        assert db_rows(data) == ([], [])
    finally:
        await qm.close()


def _schema_1(directory: Path) -> None:
    """A data directory as schema 1 wrote it, with two messages."""
    directory.mkdir(parents=True)
    db = sqlite3.connect(directory / DB_FILE)
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE queues (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
        CREATE TABLE messages (
            seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, priority INTEGER NOT NULL,
            msg_id BLOB NOT NULL, correl_id BLOB NOT NULL, put_at REAL NOT NULL,
            expiry_at REAL, backout_count INTEGER NOT NULL, md BLOB NOT NULL,
            body BLOB NOT NULL
        );
        CREATE INDEX messages_by_queue ON messages (queue, seq);
        CREATE TABLE channels (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
        CREATE TABLE channel_sync (
            channel TEXT PRIMARY KEY, batch_seq INTEGER NOT NULL, msg_ids BLOB NOT NULL
        );
        INSERT INTO meta VALUES ('schema', '1');
        """
    )
    for seq in (1, 2):
        db.execute(
            "INSERT INTO messages VALUES (?, 'Q', 0, ?, ?, 1.0, NULL, 0, x'00', ?)",
            (seq, bytes([seq]) * 24, bytes(24), BODY),
        )
    db.commit()
    db.close()


def test_schema_1_directory_is_upgraded_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "old"
    _schema_1(data)
    with caplog.at_level("WARNING", logger="gateway.mq.embedded.store"):
        store = MessageStore(data)
    assert any("from schema 1 to" in r.getMessage() and "restore a backup" in r.getMessage()
               for r in caplog.records), caplog.text
    try:
        assert [(m.seq, m.body) for m in store.load_messages()] == [(1, BODY), (2, BODY)]
        shared = BODY[:]  # one object, inserted twice: stored once next to the old rows
        store.apply([StoredMessage(s, "Q", 0, bytes([s]) * 24, bytes(24), 1.0, None, 0,
                                   b"\x00", shared) for s in (3, 4)], deletes=[1])
        assert [(m.seq, m.body) for m in store.load_messages()] == [
            (2, BODY), (3, BODY), (4, BODY)]
    finally:
        store.close()
    db = sqlite3.connect(data / DB_FILE)
    assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (
        str(SCHEMA_VERSION),)
    db.close()
    assert [r for _, r in db_rows(data)[0]] == [2]
    consistent(data)


def test_reopen_shares_one_body_object_and_logs_no_upgrade(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart the messages that shared a body share one object again (a large
    fan-out backlog needs the memory it needed while running), and an ordinary open of
    the current schema is not reported as an upgrade."""
    data = tmp_path / "qm"
    store = MessageStore(data)
    shared = BODY[:]
    store.apply([StoredMessage(s, "Q", 0, bytes([s]) * 24, bytes(24), 1.0, None, 0,
                               b"\x00", shared) for s in (1, 2, 3)])
    store.close()
    with caplog.at_level("WARNING", logger="gateway.mq.embedded.store"):
        store = MessageStore(data)
    try:
        loaded = store.load_messages()
    finally:
        store.close()
    assert [m.body for m in loaded] == [BODY] * 3
    assert loaded[0].body is loaded[1].body is loaded[2].body
    assert not [r for r in caplog.records if "upgrading" in r.getMessage()]


def test_missing_shared_body_is_a_clear_store_error(tmp_path: Path) -> None:
    data = tmp_path / "qm"
    store = MessageStore(data)
    shared = BODY[:]
    store.apply([StoredMessage(s, "Q", 0, bytes([s]) * 24, bytes(24), 1.0, None, 0,
                               b"\x00", shared) for s in (1, 2)])
    store.close()
    db = sqlite3.connect(data / DB_FILE)
    db.execute("DELETE FROM bodies")  # damage: rows still refer to it
    db.commit()
    db.close()
    store = MessageStore(data)
    try:
        with pytest.raises(StoreError, match="missing"):
            store.load_messages()
    finally:
        store.close()


def test_open_recreates_a_missing_table_or_index(tmp_path: Path) -> None:
    """An ordinary open (schema already current) still runs the idempotent creates, so
    a table or index added later without a schema bump reaches existing directories."""
    data = tmp_path / "qm"
    MessageStore(data).close()
    db = sqlite3.connect(data / DB_FILE)
    db.execute("DROP INDEX messages_by_queue")
    db.execute("DROP TRIGGER message_body_release")
    db.commit()
    db.close()
    MessageStore(data).close()
    db = sqlite3.connect(data / DB_FILE)
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    db.close()
    assert {"messages_by_queue", "message_body_release", "bodies"} <= names


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "new"
    MessageStore(data).close()
    db = sqlite3.connect(data / DB_FILE)
    db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer version"):
        MessageStore(data)


_CHILD = r"""
import asyncio, os, random, sys
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions, put_many
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

SYNC = PutOptions(syncpoint=True, set_all_context=True)

def body(batch):
    return (b"B%06d" % batch) * 200

async def main(data, journal, seed):
    rnd = random.Random(seed)
    qm = EmbeddedQueueManager("CRASHQM", data)
    qm.run_mqsc("\n".join(f"DEFINE QLOCAL(SUB.{i}) MAXDEPTH(999999) REPLACE" for i in range(4)))
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    conn = await qm.connect()
    h = await conn.open("SUB.0", OpenOption.INPUT_SHARED)
    batch = int(sys.argv[4])
    print("ready", flush=True)
    while True:
        batch += 1
        b = body(batch)
        items = [(f"SUB.{i % 4}", "", MQMD(persistence=Persistence.PERSISTENT,
                  correl_id=b"%06d" % batch + i.to_bytes(18, "big")), b)
                 for i in range(rnd.randint(8, 400))]
        os.write(fd, b"PI %d %d\n" % (batch, len(items))); os.fsync(fd)
        await put_many(conn, items, SYNC)
        await conn.commit()
        os.write(fd, b"PC %d\n" % batch); os.fsync(fd)
        for _ in range(rnd.randint(0, 150)):
            try:
                await h.get(GetOptions(wait_ms=0, syncpoint=True))
            except MQError:
                break
        if rnd.random() < 0.2:
            await conn.backout()
        else:
            await conn.commit()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _journal(path: Path) -> tuple[dict[int, int], set[int]]:
    started: dict[int, int] = {}
    committed: set[int] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[0] == "PI" and len(parts) == 3:
                started[int(parts[1])] = int(parts[2])
            elif parts[0] == "PC" and len(parts) == 2:
                committed.add(int(parts[1]))
    return started, committed


async def test_sigkill_leaves_whole_units_of_work_and_consistent_bodies(tmp_path: Path) -> None:
    """Kill the putting process at random moments (several trials, one data directory):
    on SUB.1-3, which nobody gets from, every unit of work committed is there whole, an
    interrupted one is there whole or not at all, each message has its own batch's body,
    and reference counts match the rows after every restart."""
    data, journal = tmp_path / "qm", tmp_path / "journal"
    rnd = random.Random(16)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for trial in range(6):
        started, _ = _journal(journal)
        first = max(started, default=0)
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(data), str(journal), str(trial), str(first)],
            stdout=subprocess.PIPE, env=env,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"ready"
            time.sleep(rnd.uniform(0.3, 1.5))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        consistent(data)
        started, committed = _journal(journal)
        store = MessageStore(data)
        try:
            rows = store.load_messages()
        finally:
            store.close()
        per_batch: dict[int, int] = {}
        for row in rows:
            batch = int(row.correl_id[:6])
            assert row.body == (b"B%06d" % batch) * 200
            if row.queue != "SUB.0":
                per_batch[batch] = per_batch.get(batch, 0) + 1
        for batch, n in started.items():
            expected = len([i for i in range(n) if i % 4])
            if batch in committed:
                assert per_batch.get(batch, 0) == expected, (trial, batch)
            else:
                assert per_batch.get(batch, 0) in (0, expected), (trial, batch)
        assert set(per_batch) <= set(started)
    assert len(_journal(journal)[1]) >= 6
    # and the queue manager restarts on it and drains it, leaving no body behind
    qm = EmbeddedQueueManager("CRASHQM", data)
    try:
        got = [len(await get_all(qm, f"SUB.{i}")) for i in range(4)]
    finally:
        await qm.close()
    assert sum(got) == len(rows)
    assert db_rows(data) == ([], [])
