"""The embedded queue manager's disk fills up under load while ``mqgw run`` runs, then
space comes back (issue 12 item 11): a clear error in the log (no traceback), no
corruption (the store passes SQLite's integrity check and reopens with every committed
message), nothing lost on any path, and the running gateway resumes by itself.

The disk is a small tmpfs mounted for the test (root only: ``mount -t tmpfs``); it is
filled by a file the test writes and "space comes back" when the test deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.space import SpacePolicy
from gateway.wire.constants import MsgType
from tests.faults.clients import KafkaReader, MqttReader, SteadyFeeds
from tests.faults.conftest import DISK_MB
from tests.faults.ledger import Ledger, assert_nothing_lost, report
from tests.faults.scenario import (
    FaultWorld,
    first_start,
    put_publications,
    recover_and_count,
    wait_ready,
    wait_until,
)
from tests.support.gateway import BULLETIN, STOCK, bridge_config, build_gateway
from tests.support.pubsub_messages import CONTROL, rfh2_message
from tests.support.service_client import drain, put, settle

pytestmark = [pytest.mark.faults, pytest.mark.slow]

BACKLOG = 2000
MID_LOAD = 200
#: The disk stays full at least this long, and until the gateway's log names it (at most
#: MEET_FULL_LIMIT_S: the gateway's own bound for making progress, as for MID_LOAD).
FULL_S = 10.0
MEET_FULL_LIMIT_S = 60.0
#: Padding on every inbound feed message while the disk is full: 40 messages a second of
#: 64 KB need new pages within the window, whatever free pages and WAL room the store
#: already has (without it the store may fit the small messages in its own free space and
#: never meet the full disk).
FULL_PAD = 64 * 1024
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
#: What SQLite and the OS call a full disk; the log must name it.
FULL_WORDS = ("disk is full", "No space left", "SQLITE_FULL", "disk full")


def _names_full(log: str) -> list[str]:
    """The log lines that name the full disk."""
    return [line for line in log.splitlines() if any(w.lower() in line.lower() for w in FULL_WORDS)]


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; the bytes written."""
    written = 0
    chunk = b"\0" * (64 * 1024)
    with path.open("wb", buffering=0) as out:
        with contextlib.suppress(OSError):
            while True:
                written += out.write(chunk)
        with contextlib.suppress(OSError):
            while True:  # the last partial chunk's space too
                written += out.write(b"\0" * 512)
    return written


async def test_queue_manager_disk_full_then_space_back(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path, small_disk: Path
) -> None:
    # a watermark and reserve sized for the small disk (the defaults, 64 + 16 MB, would
    # refuse every persistent put on it): filled from outside, the disk is full anyway
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
                       qm_dir=small_disk / "qm",
                       qm_extra={"min_free_mb": 8, "store_reserve_mb": 4})
    ledger = Ledger()
    gw = world.gateway()
    kafka_reader = KafkaReader(world, ledger.paths["MQ->Kafka"])
    mqtt_reader = MqttReader(world, ledger.paths["MQ->MQTT"])
    feeds = SteadyFeeds(world, ledger)
    kafka_reader.start()
    mqtt_reader.start()
    filler = small_disk / "filler"
    log_while_full = ""
    filled, resumed, running_after = 0, False, False
    full_for = 0.0
    try:
        async with asyncio.timeout(30):
            await mqtt_reader.ready.wait()
        await first_start(world, gw)
        ids = [f"q-{n}" for n in range(BACKLOG)]
        await put_publications(world, ids)
        ledger.paths["MQ->Kafka"].sent.update(ids)
        ledger.paths["MQ->MQTT"].sent.update(ids)
        gw.start()
        assert await wait_ready(gw), gw.log_tail()
        feeds.start()
        await wait_until(lambda: len(ledger.paths["MQ->Kafka"].received) >= MID_LOAD, 60)
        before = len(gw.log_since_start())
        filled = await asyncio.to_thread(fill, filler)
        full_since = time.monotonic()
        feeds.pad = FULL_PAD
        # The disk stays full until the gateway has met it (its log names it: when that
        # comes depends on how fast this machine moves the padded feeds) and FULL_S at least.
        await wait_until(lambda: _names_full(gw.log_since_start()[before:]) or not gw.running,
                         MEET_FULL_LIMIT_S)
        await asyncio.sleep(max(0.0, FULL_S - (time.monotonic() - full_since)))
        full_for = time.monotonic() - full_since
        log_while_full = gw.log_since_start()[before:]
        assert gw.running or gw.exit_code() is not None
        feeds.pad = 0
        filler.unlink()
        await asyncio.sleep(5.0)
        await feeds.close()
        outbound = (ledger.paths["MQ->Kafka"], ledger.paths["MQ->MQTT"])
        resumed = await wait_until(lambda: all(p.complete for p in outbound), 90)
        running_after = gw.running
        await recover_and_count(world, gw, ledger)
    finally:
        gw.kill()
        filler.unlink(missing_ok=True)
        await feeds.close()
        await kafka_reader.close()
        await mqtt_reader.close()
    integrity = sqlite3.connect(world.data_dir / "qmgr.sqlite3").execute(
        "PRAGMA integrity_check").fetchone()[0]
    tracebacks = log_while_full.count("Traceback")
    table = report(
        tmp_path / "fault-suite-disk-full.json", "fault suite: queue manager disk full",
        ledger, 1, disk_mb=DISK_MB, filler_bytes=filled, full_s=FULL_S,
        resumed_without_restart=resumed and running_after, integrity=integrity,
        full_for_s=round(full_for, 1),
        tracebacks_while_full=tracebacks,
    )
    assert integrity == "ok", integrity
    assert_nothing_lost(ledger, table)
    named = _names_full(log_while_full)
    assert named, (
        f"no log line names the full disk in {full_for:.0f} s:\n{log_while_full[-3000:]}"
    )
    assert tracebacks == 0, f"{tracebacks} tracebacks while the disk was full:\n{named[:5]}"
    assert running_after and resumed, (
        f"the gateway did not resume by itself once space was back\n{table}\n{gw.log_tail()}"
    )


#: The watermark of the subscriber test's small disk, and the room its filler leaves.
SUB_MIN_FREE_MB, SUB_LEFT_MB = 16, 8
SUB_QUEUES = f"""
DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL('{BULLETIN}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL(SUB.OK) DEFPSIST(YES) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


async def test_a_subscriber_copy_at_the_watermark_waits_and_is_not_dead_lettered(
    tmp_path: Path, small_disk: Path
) -> None:
    """The embedded queue manager's disk at its free-space watermark: a subscriber's
    persistent copy meets 2056, which is the whole disk's, so the batch is held back
    (not dead-lettered, the subscription not suspended) and delivered once space is
    back. A subscriber queue's own 2056 on IBM MQ is dead-lettered instead
    (tests/runtime/pubsub_service/test_service_subscriber_queues.py)."""
    qm = EmbeddedQueueManager(
        "QM1", small_disk / "qm",
        space=SpacePolicy(min_free_bytes=SUB_MIN_FREE_MB * 2**20, reserve_bytes=0),
    )
    gw = build_gateway(tmp_path, mqsc=SUB_QUEUES, qm=qm,
                       config=bridge_config(suspend_subscription_after=2))
    filler = small_disk / "filler"
    service = gw.service
    try:
        await service.start()
        await put(qm, rfh2_message(  # type: ignore[arg-type]
            CONTROL, [("Command", "RegSub"), ("Topic", "price/a"), ("QName", "SUB.OK")],
            reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST))
        await settle(qm, service)
        st = os.statvfs(small_disk)
        with filler.open("wb") as out:
            out.truncate(0)
            os.posix_fallocate(out.fileno(), 0,
                               st.f_bavail * st.f_frsize - SUB_LEFT_MB * 2**20)
        # accepted (the room is measured after each write), and its commit finds the
        # disk below the watermark
        await put(qm, rfh2_message(  # type: ignore[arg-type]
            CONTROL, [("Command", "Publish"), ("Topic", "price/a")], b"held", persistence=1))
        async with asyncio.timeout(30):
            while service.counters.backlog_full < 3:
                await asyncio.sleep(0.02)
        assert qm.space.low
        assert qm.queue_depth("SUB.OK") == 0 and qm.queue_depth(CONTROL) == 1
        assert qm.queue_depth(DLQ) == 0
        assert service.engine.suspended_subscriptions == 0
        filler.unlink()
        # Waits for the copy itself: the queue's depth counts a put whose commit is
        # still being written, which a get cannot see yet.
        got: list[bytes] = []
        async with asyncio.timeout(30):
            while not got:
                got = [r.payload for r in await drain(qm, "SUB.OK")]
                if not got:
                    await asyncio.sleep(0.02)
        assert got + [r.payload for r in await drain(qm, "SUB.OK")] == [b"held"]
        assert qm.queue_depth(DLQ) == 0
        assert service.engine.suspended_subscriptions == 0
    finally:
        filler.unlink(missing_ok=True)
        await gw.close()
