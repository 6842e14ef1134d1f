"""neighbours.db: join/clear requests, negotiation results, proxy intents and their
settling, durability across a reopen (the SIGKILL case) and the schema version."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.pubsub.neighbours import NeighbourKind, ProxyKey
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.state import (
    SCHEMA_VERSION,
    NeighbourState,
    NeighbourStateError,
)

KEY = ProxyKey("BULLETIN.STREAM", "news/#", 2)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[NeighbourState]:
    s = NeighbourState(tmp_path / "neighbours.db")
    yield s
    s.close()


def test_join_request_is_remembered_as_joining(state: NeighbourState) -> None:
    row = state.request_join(NeighbourConfig(q_mgr="A", kind="mqv7", streams=["S1"]), 100.0)
    assert (row.q_mgr, row.kind, row.state, row.joined_at) == (
        "A",
        NeighbourKind.MQV7,
        "joining",
        100.0,
    )
    assert row.configured_streams == ("S1",)
    assert row.learnt_streams is None
    state.set_state("A", "refused", "loop: A is already reachable through B")
    again = state.request_join(NeighbourConfig(q_mgr="A"), 200.0)
    assert (again.state, again.refusal, again.kind) == ("joining", "", NeighbourKind.MQPUBSUB)
    assert again.joined_at == 100.0


def test_common_streams(state: NeighbourState) -> None:
    state.request_join(NeighbourConfig(q_mgr="A", streams=["S1", "S2"]), 0)
    row = state.neighbour("A")
    assert row is not None and row.common_streams == {"S1", "S2", DEFAULT_STREAM}
    state.set_learnt_streams("A", ["S2", "S3", DEFAULT_STREAM])
    row = state.neighbour("A")
    assert row is not None and row.common_streams == {"S2", DEFAULT_STREAM}
    state.request_join(NeighbourConfig(q_mgr="B"), 0)
    row = state.neighbour("B")
    assert row is not None and row.common_streams == {DEFAULT_STREAM}
    state.set_learnt_streams("B", ["S3"])
    row = state.neighbour("B")
    assert row is not None and row.common_streams == {"S3", DEFAULT_STREAM}


def test_heard_only_moves_forward_and_only_for_neighbours(state: NeighbourState) -> None:
    state.request_join(NeighbourConfig(q_mgr="A"), 0)
    assert state.heard("A", 50.0)
    assert state.heard("A", 40.0)
    assert not state.heard("NOBODY", 60.0)
    row = state.neighbour("A")
    assert row is not None and row.last_heard == 50.0


def test_clear_request_and_forget(state: NeighbourState) -> None:
    assert not state.request_clear("A")
    state.request_join(NeighbourConfig(q_mgr="A"), 0)
    state.intend("A", KEY, b"m1", register=True)
    assert state.request_clear("A")
    row = state.neighbour("A")
    assert row is not None and row.clear_requested
    state.forget("A")
    assert state.neighbour("A") is None
    assert state.proxies() == []


def test_register_then_withdraw_settles_by_msg_id(state: NeighbourState) -> None:
    state.intend("A", KEY, b"reg", register=True)
    (p,) = state.proxies("A")
    assert (p.key, p.msg_id, p.acknowledged, p.withdrawing) == (KEY, b"reg", False, False)
    assert state.settle(b"unknown", ok=True) is None
    assert state.settle(b"reg", ok=True) is not None
    (p,) = state.proxies("A")
    assert p.acknowledged
    assert state.settle(b"reg", ok=True) is None  # a duplicate response changes nothing
    state.intend("A", KEY, b"dereg", register=False)
    (p,) = state.proxies("A")
    assert (p.withdrawing, p.acknowledged) == (True, False)
    assert state.settle(b"dereg", ok=True) is not None
    assert state.proxies("A") == []


def test_failed_regsub_is_kept_refused_with_a_doubling_backoff(state: NeighbourState) -> None:
    """Nothing is registered there (not acknowledged), but the row stays with the
    reason, so the RegSub is not sent again at once: 60 s, doubling, at most 10 min."""
    state.intend("A", KEY, b"reg", register=True)
    row = state.settle(b"reg", ok=False, reason="reason 3071 MQRCCF_STREAM_ERROR", now=1000.0)
    assert row is not None and not row.withdrawing and row.refused == ""
    (p,) = state.proxies()
    assert not p.acknowledged
    assert (p.refused, p.backoff, p.retry_at) == ("reason 3071 MQRCCF_STREAM_ERROR", 60.0, 1060.0)
    waits = []
    for i in range(6):
        state.settle(b"reg", ok=False, reason="again", now=2000.0 + i)
        (p,) = state.proxies()
        waits.append(p.retry_at - (2000.0 + i))
    assert waits == [120.0, 240.0, 480.0, 600.0, 600.0, 600.0]
    assert p.refused == "again"
    state.settle(b"reg", ok=True)
    (p,) = state.proxies()
    assert p.acknowledged and (p.refused, p.backoff, p.retry_at) == ("", 0.0, 0.0)


def test_a_version_1_file_is_brought_up_to_date(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "neighbours.db")
    db.executescript(
        "CREATE TABLE proxies (q_mgr TEXT NOT NULL, stream TEXT NOT NULL, topic TEXT NOT NULL,"
        " scheme INTEGER NOT NULL, msg_id BLOB NOT NULL, acknowledged INTEGER NOT NULL DEFAULT 0,"
        " withdrawing INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (q_mgr, stream, topic, scheme))"
        " WITHOUT ROWID; PRAGMA user_version = 1;"
    )
    db.execute("INSERT INTO proxies VALUES ('A', 'S', 't', 2, x'01', 1, 0)")
    db.commit()
    db.close()
    s = NeighbourState(tmp_path / "neighbours.db")
    try:
        (p,) = s.proxies()
        assert p.acknowledged and p.refused == ""
    finally:
        s.close()


def test_intents_survive_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "neighbours.db"
    s = NeighbourState(path)
    s.request_join(NeighbourConfig(q_mgr="A"), 0)
    s.intend("A", KEY, b"reg", register=True)
    s.intend("A", ProxyKey(DEFAULT_STREAM, "x", 2), b"reg2", register=True)
    s.settle(b"reg2", ok=True)
    # No close(): the process is gone (SIGKILL); a new process opens the file.
    again = NeighbourState(path)
    pending = [p for p in again.proxies() if not p.acknowledged]
    assert [p.msg_id for p in pending] == [b"reg"]
    assert len(again.proxies("A")) == 2
    again.close()
    s.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "neighbours.db"
    NeighbourState(path).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(NeighbourStateError, match="newer gateway"):
        NeighbourState(path)
