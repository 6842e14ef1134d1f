"""A neighbour's retained publication whose MQ unit of work did not commit, on the
broker service and the embedded queue manager: the service commits the pub/sub store
first, so the forward comes back to a store that already holds its retained copy. It
must reach the MQ subscriber once all the same -- after a failed MQ commit, and after a
crash between the two commits (a new service over the same store and queue manager) --
and the copy is settled once its unit of work commits: a later replay of it is not
delivered again (docs/neighbours.md, "Retained copies")."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from tests.runtime.pubsub_service.test_overlapped_commits import HeldWriter
from tests.runtime.streams.test_move_retained import NEIGHBOURS, S, old_owners_copies
from tests.support.pubsub_messages import CONTROL, rfh_message
from tests.support.service_client import drain, put, settle

QUEUES = f"""
DEFINE QLOCAL('{S}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL(SUB.Q) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


def service_of(qm: EmbeddedQueueManager, store: SqliteStore, retry_delay: float) -> BrokerService:
    engine = PubSubEngine(qm.name, store, neighbours=NEIGHBOURS)
    config = BrokerConfig(
        streams=[StreamQueueConfig(name=S)], wait_ms=50, retry_delay=retry_delay
    )
    return BrokerService(qm, engine, config)


def unsettled_rows(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [str(t) for t, in db.execute("SELECT topic FROM retained WHERE unsettled")]
    finally:
        db.close()


async def until(check: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("restart", [False, True], ids=["failed-commit", "crash"])
async def test_a_forward_backed_out_after_the_store_commit_reaches_the_subscriber_once(
    tmp_path: Path, restart: bool
) -> None:
    (md, body), = old_owners_copies(tmp_path)  # QMA's retained T/1, as forwarded to QMB
    forward = InboundMessage(S, md, body)
    qm = EmbeddedQueueManager("QMB", tmp_path / "qm")
    qm.run_mqsc(QUEUES, stop_on_error=True)
    store = SqliteStore(tmp_path / "qmb.db", synchronous="NORMAL")
    # after a crash, the service is not there to retry: it waits long after the failure
    service = service_of(qm, store, 30.0 if restart else 0.01)
    await service.start()
    try:
        await put(qm, rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSStreamName", S), ("MQPSTopic", "T/1"),
             ("MQPSQName", "SUB.Q")],
            reply_to_q="REPLY.Q", reply_to_q_mgr="QMB", msg_type=1,
        ))
        await settle(qm, service)
        assert [r.get("MQPSReason") for r in await drain(qm, "REPLY.Q")] == ["0"]

        writer = HeldWriter(qm, 1, fail=True)  # the forward's MQ commit fails ...
        writer.release.set()
        await put(qm, forward)
        await until(lambda: not writer.armed and service.counters.backouts >= 1)
        # ... after the store's commit: the store holds the retained copy already
        assert [r.topic for r in service.engine.retained(S)] == ["T/1"]
        if restart:
            await service.stop()  # the process dies: only the store and MQ remain
            store.close()
            assert qm.queue_depth(S) == 1  # MQ backed the forward out
            store = SqliteStore(tmp_path / "qmb.db", synchronous="NORMAL")
            service = service_of(qm, store, 0.01)
            await service.start()
        await settle(qm, service)
        got = await drain(qm, "SUB.Q")
        assert [r.payload for r in got] == [b"T/1"]

        # committed now, the copy is settled: the same forward again (a neighbour's
        # replay to a new proxy, a move run again) reaches nobody
        await put(qm, forward)
        await settle(qm, service)
        assert await drain(qm, "SUB.Q") == []
        assert qm.queue_depth(S) == 0
        await service.stop()  # a clean stop writes the settles no batch carried
        assert unsettled_rows(tmp_path / "qmb.db") == []
    finally:
        await service.stop()
        store.close()
        await qm.close()
