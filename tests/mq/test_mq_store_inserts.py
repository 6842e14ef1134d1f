"""How the embedded queue manager's store writes a unit of work's messages (issue 32).

A fan-out's unit of work holds thousands of message rows. Each INSERT statement gives
the GIL up while SQLite runs it and needs it back afterwards, which the writer thread
gets only every switch interval while the event loop is busy: so a transaction must be a
few statements, not one per 90 rows, and only a few statement texts may ever exist (each
compiled once, kept in the connection's statement cache). What must hold besides: every
row is stored as given, in one transaction, and reads back after a reopen.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.mq.embedded.store import (
    INSERT_ROWS_MAX,
    MessageStore,
    StoredMessage,
    insert_chunks,
    rows_per_insert,
)

BODY = bytes(range(256)) * 4  # shared by every row of the transaction (fan-out)


def rows(first: int, count: int) -> list[StoredMessage]:
    return [
        StoredMessage(
            seq, f"SUB.{seq % 4}", seq % 10, b"M" + seq.to_bytes(23, "big"),
            b"C" + seq.to_bytes(23, "big"), 1000.0 + seq, None if seq % 3 else 2000.0 + seq,
            0, b"D" * 364, BODY if seq % 5 else b"own body %d" % seq,
        )
        for seq in range(first, first + count)
    ]


def test_a_fan_out_transaction_is_a_few_statements(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "qm")
    statements: list[str] = []
    try:
        store._db.set_trace_callback(statements.append)
        store.apply(rows(1, 2000))
        store._db.set_trace_callback(None)
    finally:
        store.close()
    inserts = [s for s in statements if s.startswith("INSERT INTO messages")]
    # 2,000 = 1024 + 512 + 256 + 128 + 64 + 16 rows where SQLite allows 32,766 values
    assert len(inserts) <= 6, len(inserts)
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
        "BEGIN IMMEDIATE", "COMMIT"]


def test_every_row_reads_back_after_a_reopen(tmp_path: Path) -> None:
    store = MessageStore(tmp_path / "qm")
    written = rows(1, 5000) + rows(7000, 37)
    try:
        store.apply(written[:5000])
        store.apply(written[5000:], deletes=[2, 4999])
    finally:
        store.close()
    store = MessageStore(tmp_path / "qm")
    try:
        loaded = store.load_messages()
    finally:
        store.close()
    expected = [m for m in written if m.seq not in (2, 4999)]
    assert sorted(loaded, key=lambda m: m.seq) == expected


@pytest.mark.parametrize("count", [0, 1, 2, 3, 63, 64, 65, 1000, 2047, 2048, 2049, 6000])
def test_chunks_cover_the_rows_once_in_few_distinct_sizes(count: int) -> None:
    chunks = insert_chunks(count, INSERT_ROWS_MAX)
    assert sum(n for _, n in chunks) == count
    assert [start for start, _ in chunks] == [sum(n for _, n in chunks[:i])
                                             for i in range(len(chunks))]
    assert all(n & (n - 1) == 0 and 0 < n <= INSERT_ROWS_MAX for _, n in chunks)
    assert len(chunks) <= count // INSERT_ROWS_MAX + INSERT_ROWS_MAX.bit_length()


def test_statement_size_follows_the_librarys_limit() -> None:
    assert rows_per_insert(999) == 64  # SQLite before 3.32: 90 rows fit, a power of two
    assert rows_per_insert(32766) == INSERT_ROWS_MAX
    assert rows_per_insert(5) == 1
    limit = sqlite3.connect(":memory:").getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    assert rows_per_insert(limit) * 11 <= limit
