"""CorrelationStore: requester/service entries, due/purge/counts, durability, locking."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.routing.correlation import PendingRequest, PendingService, State
from gateway.routing.correlation_store import (
    SCHEMA_VERSION,
    CorrelationStore,
    CorrelationStoreError,
    SchemaVersionError,
    StoreInUseError,
)


def _request(n: int = 1, *, deadline: float = 100.0, **changes: object) -> PendingRequest:
    p = PendingRequest(
        key=bytes([n]) * 24,
        route="quote",
        source_id=f"quote|id|{n:02x}",
        reply_topic="replies/x",
        correlation_data=b"cd-%d" % n,
        msg_id=bytes([n]) * 24,
        deadline=deadline,
    )
    for name, value in changes.items():
        setattr(p, name, value)
    return p


def _service(n: int = 1, *, deadline: float = 100.0, **changes: object) -> PendingService:
    p = PendingService(
        token=bytes([n]) * 24,
        route="pricing",
        msg_id=bytes([n]) * 24,
        correl_id=bytes(24),
        reply_to_q="APP.REPLY",
        reply_to_q_mgr="QMA",
        report=0x1000000,
        persistence=1,
        priority=4,
        expiry_at=None,
        deadline=deadline,
    )
    for name, value in changes.items():
        setattr(p, name, value)
    return p


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CorrelationStore]:
    s = CorrelationStore(tmp_path / "rr" / "request_reply.db")
    yield s
    s.close()


def test_request_lifecycle(store: CorrelationStore) -> None:
    p = _request()
    assert store.request(p.key) is None
    assert store.add_request(p) is True
    assert store.add_request(_request(outcome="other")) is False  # key present: unchanged
    assert store.request(p.key) == p
    store.mark_sent(p.key)
    got = store.request(p.key)
    assert got is not None and got.sent and got.state is State.OPEN
    assert store.finish_request(p.key, "reply", 50.0) is True
    assert store.finish_request(p.key, "timeout", 51.0) is False  # already DONE
    assert store.finish_request(b"\xff" * 24, "reply", 51.0) is False  # absent
    done = store.request(p.key)
    assert done is not None
    assert (done.state, done.outcome, done.sent) == (State.DONE, "reply", True)


def test_a_batch_of_requests_is_recorded_and_marked_in_one_transaction_each(
    store: CorrelationStore,
) -> None:
    """add_requests leaves a key already present as it is (as add_request does) and, with
    mark_all_sent, is one transaction: one SQLite commit each, not one per entry."""
    store.add_request(_request(1, outcome="kept"))
    commits: list[str] = []
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    store.add_requests([_request(1), _request(2), _request(3)])
    store.mark_all_sent([bytes([2]) * 24, bytes([3]) * 24])
    store._db.set_trace_callback(None)
    assert commits == ["COMMIT", "COMMIT"]
    first, second, third = (store.request(bytes([n]) * 24) for n in (1, 2, 3))
    assert first is not None and first.outcome == "kept" and not first.sent
    assert second == _request(2, sent=True) and third == _request(3, sent=True)
    store.add_requests([])  # nothing to write: no transaction
    store.mark_all_sent([])


def test_the_entries_of_a_batch_of_replies_are_finished_in_one_transaction(
    store: CorrelationStore,
) -> None:
    """finish_requests: each open entry gets its own outcome, one already finished keeps
    its own (only OPEN -> DONE, once), and the whole is one SQLite commit."""
    store.add_requests([_request(1), _request(2), _request(3)])
    store.finish_request(bytes([3]) * 24, "timeout", 5.0)
    commits: list[str] = []
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    store.finish_requests(
        [(bytes([1]) * 24, "reply"), (bytes([2]) * 24, "expired"), (bytes([3]) * 24, "reply")],
        9.0,
    )
    store._db.set_trace_callback(None)
    assert commits == ["COMMIT"]
    outcomes = [store.request(bytes([n]) * 24) for n in (1, 2, 3)]
    assert [(p.state, p.outcome) for p in outcomes if p is not None] == [
        (State.DONE, "reply"), (State.DONE, "expired"), (State.DONE, "timeout")
    ]
    store.finish_requests([], 9.0)  # nothing to write: no transaction


def test_sent_marks_have_no_flush_of_their_own_and_every_other_write_has(
    store: CorrelationStore,
) -> None:
    """The "sent" marks commit with synchronous=NORMAL (WAL: no fsync of their own; a
    power loss may take one back, which only puts a redelivered request again); the
    connection is at FULL before and after, so entries and outcomes stay durable."""
    store.add_requests([_request(1), _request(2)])
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.mark_all_sent([bytes([1]) * 24])
    store.mark_sent(bytes([2]) * 24)
    store._db.set_trace_callback(None)
    assert [s for s in statements if s.startswith("PRAGMA") or s == "COMMIT"] == [
        "PRAGMA synchronous=NORMAL", "COMMIT", "PRAGMA synchronous=FULL",
    ] * 2
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert all(p is not None and p.sent for p in (store.request(bytes([n]) * 24)
                                                  for n in (1, 2)))


def test_a_failed_batch_write_is_rolled_back_and_leaves_no_transaction_open(
    store: CorrelationStore,
) -> None:
    """A row SQLite cannot take ends the batch: nothing of it stays, and the next write
    is a durable transaction of its own, not part of one left open."""
    bad = _request(2)
    bad.key = object()  # type: ignore[assignment]  # not a type SQLite can bind
    with pytest.raises(CorrelationStoreError):
        store.add_requests([_request(1), bad])
    assert not store._db.in_transaction
    assert store.request(_request(1).key) is None
    assert store.add_request(_request(3)) is True
    assert not store._db.in_transaction


def test_service_lifecycle(store: CorrelationStore) -> None:
    p = _service(expiry_at=123.5)
    assert store.service(p.token) is None
    assert store.add_service(p) is True
    assert store.add_service(_service(route="x")) is False
    assert store.service(p.token) == p
    assert store.finish_service(p.token, "reply", 10.0) is True
    assert store.finish_service(p.token, "timeout", 11.0) is False
    done = store.service(p.token)
    assert done is not None and (done.state, done.outcome) == (State.DONE, "reply")


def test_service_entry_is_recorded_before_it_is_produced(store: CorrelationStore) -> None:
    p = _service(produced=False)
    assert store.add_service(p)
    got = store.service(p.token)
    assert got is not None and not got.produced and got.state is State.OPEN
    store.mark_service_produced(p.token)
    got = store.service(p.token)
    assert got is not None and got.produced


def test_a_file_without_the_produced_column_is_upgraded(tmp_path: Path) -> None:
    """A store written before services.produced: its entries count as produced."""
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    s.add_service(_service(3))
    s.close()
    db = sqlite3.connect(str(path))
    db.execute("ALTER TABLE services DROP COLUMN produced")
    db.commit()
    db.close()
    s = CorrelationStore(path)
    try:
        got = s.service(bytes([3]) * 24)
        assert got is not None and got.produced
        assert s.add_service(_service(4, produced=False))
        got = s.service(bytes([4]) * 24)
        assert got is not None and not got.produced
    finally:
        s.close()


def test_requester_and_service_keys_are_separate(store: CorrelationStore) -> None:
    assert store.add_request(_request(7))
    assert store.add_service(_service(7))
    assert store.request(bytes([7]) * 24) is not None
    assert store.service(bytes([7]) * 24) is not None


def test_due_lists_open_entries_past_deadline_earliest_first(store: CorrelationStore) -> None:
    store.add_request(_request(1, deadline=30.0))
    store.add_request(_request(2, deadline=10.0))
    store.add_request(_request(3, deadline=99.0))
    store.add_service(_service(4, deadline=20.0))
    store.add_request(_request(5, deadline=5.0))
    store.finish_request(bytes([5]) * 24, "reply", 1.0)
    due = store.due(30.0)
    assert [(type(p).__name__, p.deadline) for p in due] == [
        ("PendingRequest", 10.0),
        ("PendingService", 20.0),
        ("PendingRequest", 30.0),
    ]
    assert [p.deadline for p in store.due(30.0, limit=2)] == [10.0, 20.0]
    assert store.due(4.0) == []


def test_an_entry_postponed_drops_behind_the_others_until_its_next_try(
    store: CorrelationStore,
) -> None:
    """Issue 29: the sweeper could not finish 1 and 2; later entries come first, and
    1 and 2 come back at their next try, each attempt counted."""
    for n in range(1, 4):
        store.add_request(_request(n, deadline=float(n)))
    store.add_service(_service(4, deadline=4.0))
    store.postpone_request(bytes([1]) * 24, retry_at=50.0)
    store.postpone_request(bytes([2]) * 24, retry_at=40.0)
    assert [p.deadline for p in store.due(10.0, limit=2)] == [3.0, 4.0]
    assert [p.deadline for p in store.due(45.0)] == [3.0, 4.0, 2.0]
    store.postpone_request(bytes([2]) * 24, retry_at=60.0)
    store.postpone_service(bytes([4]) * 24, retry_at=55.0)
    assert [(p.deadline, p.attempts) for p in store.due(100.0)] == [
        (3.0, 0), (1.0, 1), (4.0, 1), (2.0, 2)]
    got = store.request(bytes([2]) * 24)
    assert got is not None and got.attempts == 2 and got.retry_at == 60.0
    store.finish_request(bytes([2]) * 24, "undeliverable", 70.0)
    store.postpone_request(bytes([2]) * 24, retry_at=80.0)  # finished: left as it is
    got = store.request(bytes([2]) * 24)
    assert got is not None and got.attempts == 2 and got.outcome == "undeliverable"


def test_the_first_refusal_of_an_entrys_destination_is_kept(store: CorrelationStore) -> None:
    """``undeliverable_after`` counts from the first try its destination refused;
    tries an outage failed leave that time as it is (None before any refusal)."""
    store.add_request(_request(1, deadline=1.0))
    store.add_service(_service(2, deadline=2.0))
    key, token = bytes([1]) * 24, bytes([2]) * 24
    store.postpone_request(key, retry_at=10.0)  # an outage
    store.postpone_service(token, retry_at=10.0)
    got = store.request(key)
    assert got is not None and (got.attempts, got.refused_since) == (1, None)
    store.postpone_request(key, retry_at=20.0, refused_at=15.0)
    store.postpone_request(key, retry_at=30.0)  # an outage again
    store.postpone_request(key, retry_at=40.0, refused_at=35.0)
    store.postpone_service(token, retry_at=20.0, refused_at=16.0)
    got = store.request(key)
    assert got is not None and (got.attempts, got.retry_at, got.refused_since) == (
        4, 40.0, 15.0)
    service = store.service(token)
    assert service is not None and (service.attempts, service.refused_since) == (2, 16.0)


def test_a_file_without_the_refused_since_column_is_upgraded(tmp_path: Path) -> None:
    """A store written before refused_since opens; no destination of its entries had
    refused (what counted then is not known: the bound starts at the next refusal)."""
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    s.add_request(_request(1, deadline=5.0))
    s.add_service(_service(2, deadline=6.0))
    s.close()
    db = sqlite3.connect(str(path))
    for table in ("requests", "services"):
        db.execute(f"ALTER TABLE {table} DROP COLUMN refused_since")
    db.commit()
    db.close()
    s = CorrelationStore(path)
    try:
        assert [p.refused_since for p in s.due(10.0)] == [None, None]
        s.postpone_request(bytes([1]) * 24, retry_at=20.0, refused_at=7.0)
        got = s.request(bytes([1]) * 24)
        assert got is not None and got.refused_since == 7.0
    finally:
        s.close()


def test_a_file_without_the_retry_columns_is_upgraded(tmp_path: Path) -> None:
    """A store written before attempts/retry_at opens; its entries have not been tried."""
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    s.add_request(_request(1, deadline=5.0))
    s.add_service(_service(2, deadline=6.0))
    s.close()
    db = sqlite3.connect(str(path))
    for table in ("requests", "services"):
        db.execute(f"DROP INDEX {table}_next")
        db.execute(f"ALTER TABLE {table} DROP COLUMN attempts")
        db.execute(f"ALTER TABLE {table} DROP COLUMN retry_at")
    db.commit()
    db.close()
    s = CorrelationStore(path)
    try:
        assert [(p.deadline, p.attempts, p.retry_at) for p in s.due(10.0)] == [
            (5.0, 0, None), (6.0, 0, None)]
        s.postpone_request(bytes([1]) * 24, retry_at=20.0)
        assert [p.deadline for p in s.due(10.0)] == [6.0]
    finally:
        s.close()


def test_purge_removes_only_old_done_entries(store: CorrelationStore) -> None:
    store.add_request(_request(1))
    store.add_request(_request(2))
    store.add_service(_service(3))
    store.add_service(_service(4))
    store.finish_request(bytes([1]) * 24, "reply", 100.0)
    store.finish_service(bytes([3]) * 24, "timeout", 200.0)
    assert store.purge(now=150.0, retention=60.0) == 0
    assert store.purge(now=160.0, retention=60.0) == 1
    assert store.request(bytes([1]) * 24) is None
    assert store.request(bytes([2]) * 24) is not None  # OPEN: never purged
    assert store.purge(now=10_000.0, retention=60.0) == 1
    assert store.service(bytes([3]) * 24) is None
    assert store.service(bytes([4]) * 24) is not None


def test_counts(store: CorrelationStore) -> None:
    assert store.counts() == {
        "requester_open": 0,
        "requester_done": 0,
        "service_open": 0,
        "service_done": 0,
    }
    for n in (1, 2, 3):
        store.add_request(_request(n))
    store.add_service(_service(4))
    store.finish_request(bytes([2]) * 24, "reply", 1.0)
    assert store.counts() == {
        "requester_open": 2,
        "requester_done": 1,
        "service_open": 1,
        "service_done": 0,
    }


_ids = st.binary(min_size=24, max_size=24)
_text = st.text(max_size=60)
_times = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_requests = st.builds(
    PendingRequest,
    key=_ids,
    route=_text,
    source_id=_text,
    reply_topic=_text,
    correlation_data=st.binary(max_size=300),
    msg_id=_ids,
    deadline=_times,
    state=st.sampled_from(State),
    outcome=_text,
    sent=st.booleans(),
    refused_since=st.none() | _times,
)
_services = st.builds(
    PendingService,
    token=_ids,
    route=_text,
    msg_id=_ids,
    correl_id=_ids,
    reply_to_q=_text,
    reply_to_q_mgr=_text,
    report=_int32,
    persistence=_int32,
    priority=_int32,
    expiry_at=st.none() | _times,
    deadline=_times,
    state=st.sampled_from(State),
    outcome=_text,
    produced=st.booleans(),
    refused_since=st.none() | _times,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=_requests)
def test_request_round_trips_every_field(store: CorrelationStore, p: PendingRequest) -> None:
    store.add_request(p)
    assert store.request(p.key) == p
    assert store.purge(now=1e13, retention=0) >= 0  # keep the file small between examples
    store.finish_request(p.key, "x", -1e13)
    store.purge(now=1e13, retention=0)
    assert store.request(p.key) is None


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=_services)
def test_service_round_trips_every_field(store: CorrelationStore, p: PendingService) -> None:
    store.add_service(p)
    assert store.service(p.token) == p
    store.finish_service(p.token, "x", -1e13)
    store.purge(now=1e13, retention=0)
    assert store.service(p.token) is None


def test_reopen_keeps_entries(tmp_path: Path) -> None:
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    s.add_request(_request(1))
    s.add_service(_service(2))
    s.close()
    s.close()  # idempotent
    again = CorrelationStore(path)
    try:
        assert again.request(bytes([1]) * 24) == _request(1)
        assert again.service(bytes([2]) * 24) == _service(2)
    finally:
        again.close()


_CHILD = """
import sys, time
from pathlib import Path
from gateway.routing.correlation import PendingRequest, PendingService
from gateway.routing.correlation_store import CorrelationStore
s = CorrelationStore(Path(sys.argv[1]))
for n in range(1, 51):
    key = bytes([n]) * 24
    s.add_request(PendingRequest(key=key, route="r", source_id=str(n), reply_topic="t",
                                 correlation_data=b"c", msg_id=key, deadline=float(n)))
    s.mark_sent(key)
    if n % 2:
        s.finish_request(key, "reply", float(n))
    s.add_service(PendingService(token=key, route="s", msg_id=key, correl_id=bytes(24),
                                 reply_to_q="Q", reply_to_q_mgr="QM", report=0,
                                 persistence=1, priority=0, expiry_at=None,
                                 deadline=float(n)))
print("committed", flush=True)
time.sleep(60)
"""


def test_committed_entries_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "request_reply.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "committed"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    s = CorrelationStore(path)  # the lock died with the child
    try:
        for n in range(1, 51):
            key = bytes([n]) * 24
            r = store_request = s.request(key)
            assert store_request is not None and r is not None
            assert r.sent is True
            assert (r.state, r.outcome) == ((State.DONE, "reply") if n % 2 else (State.OPEN, ""))
            assert s.service(key) is not None
        assert s.counts() == {
            "requester_open": 25,
            "requester_done": 25,
            "service_open": 50,
            "service_done": 0,
        }
    finally:
        s.close()


_OPENER = """
import sys
import threading
from pathlib import Path
from gateway.routing.correlation_store import CorrelationStore, StoreInUseError
try:
    CorrelationStore(Path(sys.argv[1]))
except StoreInUseError as exc:
    print("in use:", exc)
    sys.exit(3)
print("opened")
"""


def test_second_process_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    try:
        run = subprocess.run(
            [sys.executable, "-c", _OPENER, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 3, run.stdout + run.stderr
        assert "in use by another process" in run.stdout
        assert "pid " in run.stdout
    finally:
        s.close()
    run = subprocess.run(
        [sys.executable, "-c", _OPENER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert (run.returncode, run.stdout.strip()) == (0, "opened")


def test_second_open_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "request_reply.db"
    s = CorrelationStore(path)
    try:
        with pytest.raises(StoreInUseError, match="in use"):
            CorrelationStore(path)
    finally:
        s.close()


def test_schema_version_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "request_reply.db"
    CorrelationStore(path).close()
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(SchemaVersionError, match="schema version 99"):
        CorrelationStore(path)
    # The failed open released its lock: a store with the right version opens again.
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
    db.commit()
    db.close()
    CorrelationStore(path).close()


def test_threads_share_one_store(store: CorrelationStore) -> None:
    def work(base: int) -> None:
        for n in range(base, base + 50):
            key = n.to_bytes(24, "big")
            assert store.add_request(_request(1, key=key, msg_id=key))
            assert store.request(key) is not None
            assert store.finish_request(key, "reply", 1.0)

    threads = [threading.Thread(target=work, args=(i * 1000,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.counts()["requester_done"] == 200


def test_closed_store_raises_its_own_error(tmp_path: Path) -> None:
    s = CorrelationStore(tmp_path / "request_reply.db")
    s.close()
    with pytest.raises(CorrelationStoreError):
        s.request(bytes(24))
