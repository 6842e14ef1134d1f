"""The SQLite subscription store's writer thread (issue 16): commits off the event loop,
in submission order whichever of ``apply``/``apply_async`` submitted them, durable when
they return, and the engine's ``commit_async`` settling exactly what was pending."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.errors import StoreError
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import Destination, SubFormat, Subscription
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import (
    DeleteSubscription,
    Mutation,
    RecordCommand,
    UpsertSubscription,
)
from gateway.pubsub.topics import Scheme
from gateway.wire.constants import MsgType
from tests.support.pubsub_messages import CONTROL, rfh_message


def sub(topic: str, queue: str = "SUB.Q") -> Subscription:
    return Subscription("", topic, Scheme.TOPIC, Destination("QM1", queue), SubFormat.RFH2)


def fail_writes(store: SqliteStore) -> None:
    """Every mutation from now on fails inside the transaction (a disk error)."""

    def broken(db: sqlite3.Connection, m: Mutation) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    store._apply_one = broken  # type: ignore[method-assign]


def regsub_msg(topic: str, queue: str = "SUB.Q") -> InboundMessage:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", topic), ("MQPSQName", queue)]
    return rfh_message(CONTROL, pairs, reply_to_q="R.Q", msg_type=MsgType.REQUEST)


async def test_apply_async_runs_on_the_writer_thread_in_order(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    threads: list[int] = []
    real = store._apply_locked

    def spy(mutations: list[Mutation]) -> None:
        threads.append(threading.get_ident())
        real(mutations)

    store._apply_locked = spy  # type: ignore[method-assign]
    a, b = sub("a/#"), sub("b/#")
    try:
        # submitted back to back, awaited together: applied in submission order
        first = asyncio.ensure_future(store.apply_async([UpsertSubscription(a)]))
        second = asyncio.ensure_future(store.apply_async([DeleteSubscription(a.key)]))
        third = asyncio.ensure_future(store.apply_async([UpsertSubscription(b)]))
        await asyncio.gather(first, second, third)
        store.apply([UpsertSubscription(a)])  # the blocking form shares the thread
        assert threads and threading.get_ident() not in threads
        assert len(set(threads)) == 1
    finally:
        store.close()
    reopened = SqliteStore(tmp_path / "s.db")
    try:
        assert sorted(s.topic for s in reopened.load().subscriptions) == ["a/#", "b/#"]
    finally:
        reopened.close()


async def test_apply_async_failure_is_a_store_error(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    fail_writes(store)
    try:
        with pytest.raises(StoreError):
            await store.apply_async([UpsertSubscription(sub("a"))])
        assert store.load().subscriptions == []  # rolled back
    finally:
        store.close()


async def test_engine_commit_async_is_durable_and_rollback_still_undoes(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    engine = PubSubEngine("QM1", SqliteStore(path))
    engine.handle(regsub_msg("a/*"))
    await engine.commit_async()
    engine.handle(regsub_msg("b/*"))
    engine.rollback()
    assert [s.topic for s in engine.subscriptions] == ["a/*"]
    engine.store.close()
    again = PubSubEngine("QM1", SqliteStore(path))
    try:
        assert [s.topic for s in again.subscriptions] == ["a/*"]
    finally:
        again.store.close()


async def test_commit_async_failure_leaves_the_batch_undoable(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "broker.db")
    engine = PubSubEngine("QM1", store)
    engine.handle(regsub_msg("a/*"))
    fail_writes(store)
    try:
        with pytest.raises(StoreError):
            await engine.commit_async()
        engine.rollback()  # what the service does on any failure of the batch
        assert engine.subscriptions == []
    finally:
        store.close()


def slow_writes(store: SqliteStore) -> tuple[threading.Event, threading.Event]:
    """The writer thread signals ``started`` and then holds each batch until ``release``."""
    started, release = threading.Event(), threading.Event()
    real = store._apply_locked

    def held(mutations: list[Mutation]) -> None:
        started.set()
        assert release.wait(10)
        real(mutations)

    store._apply_locked = held  # type: ignore[method-assign]
    return started, release


async def test_cancelled_commit_async_settles_a_batch_that_reaches_disk(tmp_path: Path) -> None:
    """Review F4: a cancellation while the store writes waits for the write, then the
    engine treats the batch as committed, so the service's rollback cannot undo in
    memory what is on disk."""
    path = tmp_path / "broker.db"
    store = SqliteStore(path)
    engine = PubSubEngine("QM1", store)
    started, release = slow_writes(store)
    engine.handle(regsub_msg("a/*"))
    task = asyncio.ensure_future(engine.commit_async())
    try:
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the write it submitted
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.pending_mutations == []
        engine.rollback()  # what the service does on any exception of the batch
        assert [s.topic for s in engine.subscriptions] == ["a/*"]
    finally:
        release.set()
        store.close()
    again = SqliteStore(path)
    try:
        assert [s.topic for s in again.load().subscriptions] == ["a/*"]
    finally:
        again.close()


async def test_cancelled_apply_async_whose_write_fails_raises_the_store_error(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "broker.db")
    engine = PubSubEngine("QM1", store)
    fail_writes(store)
    started, release = slow_writes(store)
    engine.handle(regsub_msg("a/*"))
    task = asyncio.ensure_future(engine.commit_async())
    try:
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0.02)
        release.set()
        with pytest.raises(StoreError):
            await task
        engine.rollback()  # not on disk: still undoable
        assert engine.subscriptions == []
    finally:
        release.set()
        store.close()


async def test_journal_reads_do_not_wait_for_a_commit_in_flight(tmp_path: Path) -> None:
    """Review F10: ``recorded_result`` (on the event loop, per command) reads on its own
    WAL connection: a write transaction held open on the writer thread does not hold it
    up, and it sees committed results only."""
    store = SqliteStore(tmp_path / "broker.db")
    store.apply([RecordCommand("Q", b"a" * 24, 0, 0)])
    inside, release = threading.Event(), threading.Event()
    real = store._apply_one

    def held(db: sqlite3.Connection, m: Mutation) -> None:
        real(db, m)
        inside.set()  # in the middle of BEGIN IMMEDIATE ... COMMIT
        assert release.wait(10)

    store._apply_one = held  # type: ignore[method-assign]
    writing = asyncio.ensure_future(store.apply_async([RecordCommand("Q", b"b" * 24, 2, 2035)]))
    try:
        while not inside.is_set():
            await asyncio.sleep(0.001)
        async with asyncio.timeout(2):
            first = await asyncio.to_thread(store.recorded_result, "Q", b"a" * 24)
            pending = await asyncio.to_thread(store.recorded_result, "Q", b"b" * 24)
        assert (first, pending) == ((0, 0), None)  # not committed yet: not seen
        release.set()
        await writing
        assert store.recorded_result("Q", b"b" * 24) == (2, 2035)
    finally:
        release.set()
        await asyncio.gather(writing, return_exceptions=True)
        store.close()
