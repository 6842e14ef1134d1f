"""Hostile input: the gateway's own sink backlog queues (issue 29).

A sink's backlog queue ``SYSTEM.MQGW.SINK.<instance>`` carries what the gateway will
send to Kafka or MQTT with its own authority. Whatever else lands there -- a forged
message in the backlog format (``MQGWENV1``) put by a process with the gateway's own
authority (a reply route, an operator's script), a message in another format, a
message an MQ application of another OS user puts over the local socket, a message
arriving over a receiving channel -- must never reach the sink: the queue manager
refuses other users (MQRC_NOT_AUTHORIZED 2035, as an object authority on IBM MQ), and
the forwarder moves anything not sealed by the gateway to the dead-letter queue with a
reason (2035 for a wrong origin, MQRC_FORMAT_ERROR 2110 for a wrong Format), counts it
and goes on with the backlog behind it.

The last test is the backlog filling a small disk while Kafka is stopped: the free-space
watermark stops the backlog before the disk is full, the gateway keeps serving what it
can, and once Kafka is back everything drains by itself, without a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.client import connect_local
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.port import MQError, OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.backlog_format import (
    BACKLOG_FORMAT,
    backlog_queue_name,
    encode_backlog_message,
)
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import wrap_for_xmitq
from plugins.memory import MemoryConfig, MemoryInstance, get_bus, reset_buses
from tests.faults.clients import KafkaReader, MqttReader
from tests.faults.conftest import DISK_MB
from tests.faults.ledger import Ledger, assert_nothing_lost, report
from tests.faults.scenario import OUT_STREAM, FaultWorld, first_start, wait_ready, wait_until
from tests.support.gateway import STOCK, InProcessGateway, bridge_config, build_gateway
from tests.support.pubsub_messages import rfh_message
from tests.support.service_client import drain_raw

ROOT = Path(__file__).resolve().parents[2]
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
SINK = "feed"
BACKLOG = backlog_queue_name(SINK)
STOCK_ALL = f"$SYS/STREAM/{STOCK}/#"


def _forged_body(payload: bytes) -> bytes:
    """A body in the backlog format, as an attacker who read docs/operations.md makes it."""
    return encode_backlog_message(Envelope(stream=STOCK, topic="PRICE/IBM", payload=payload))


def _gateway(path: Path) -> InProcessGateway:
    return build_gateway(path, config=bridge_config(retry_delay=0.01, sink_retry_max_delay=0.1))


async def _start(path: Path) -> InProcessGateway:
    reset_buses()
    gw = _gateway(path)
    await gw.start(
        MemoryInstance(SINK, MemoryConfig.model_validate({"subscribe": [STOCK_ALL], "bus": SINK}))
    )
    return gw


async def _publish(gw: InProcessGateway, payload: bytes) -> None:
    """A genuine publication on the stream: it reaches the sink through the backlog."""
    msg = rfh_message(STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", "PRICE/IBM")], payload)
    conn = await gw.qm.connect()
    try:
        await conn.put1(STOCK, msg.md, msg.body, PutOptions())
    finally:
        await conn.disconnect()


async def _dead_letters(gw: InProcessGateway, count: int, timeout: float = 20) -> list[int]:
    """The MQDLH reasons of the first ``count`` dead letters naming the backlog."""
    got: list[int] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            for m in await drain_raw(gw.qm, DLQ):
                dlh, _md, _body = unwrap_from_dlq(m.md, m.body)
                assert dlh.dest_q_name.strip() == BACKLOG
                got.append(dlh.reason)
            if len(got) < count:
                await asyncio.sleep(0.02)
    return got


async def _genuine_only(gw: InProcessGateway, genuine: bytes) -> None:
    """The genuine publication (put after the forgeries, so behind them on the FIFO
    backlog) arrives, and nothing else did."""
    records = await get_bus(SINK).wait_for(1, timeout=20)
    assert [r.payload for r in records] == [genuine], [r.payload for r in records]


async def test_a_forged_backlog_message_put_in_process_is_dead_lettered(tmp_path: Path) -> None:
    """A put with the gateway's own authority (what a service route's reply does with
    the ReplyToQ a request names): the backlog format with every context field a real
    backlog message has, and a message in another format."""
    gw = await _start(tmp_path)
    try:
        conn = await gw.qm.connect()
        try:
            forged = MQMD(format=BACKLOG_FORMAT, user_identifier=gw.qm._context.user,
                          put_appl_name=gw.qm.appl_name, persistence=1)
            await conn.put1(BACKLOG, forged, _forged_body(b"forged price 0.01"),
                            PutOptions(set_all_context=True))
            await conn.put1(BACKLOG, MQMD(format="MQSTR"), _forged_body(b"not our format"),
                            PutOptions())
        finally:
            await conn.disconnect()
        await _publish(gw, b"genuine")
        await _genuine_only(gw, b"genuine")
        assert sorted(await _dead_letters(gw, 2)) == [Reason.NOT_AUTHORIZED, Reason.FORMAT_ERROR]
        counted = gw.service.sink_backlogs.counters()[SINK].dead_lettered
        assert counted == {Reason.NOT_AUTHORIZED: 1, Reason.FORMAT_ERROR: 1}, counted
        assert gw.qm.queue_depth(BACKLOG) == 0
    finally:
        await gw.close()


async def test_a_message_arriving_over_a_channel_for_a_backlog_is_dead_lettered(
    tmp_path: Path,
) -> None:
    """A neighbour queue manager addresses the backlog through a channel: the receiving
    MCA refuses it as IBM MQ's would without the put authority (DLQ, 2035)."""
    gw = await _start(tmp_path)
    try:
        md, body = wrap_for_xmitq(
            MQMD(format=BACKLOG_FORMAT, persistence=1), _forged_body(b"over a channel"),
            BACKLOG, "QM1",
        )
        conn = await gw.qm.connect()
        try:
            delivered = await conn.deliver_transmission(md, body)
        finally:
            await conn.disconnect()
        assert delivered.dead_lettered and delivered.reason == Reason.NOT_AUTHORIZED
        assert await _dead_letters(gw, 1) == [Reason.NOT_AUTHORIZED]
        await _publish(gw, b"genuine")
        await _genuine_only(gw, b"genuine")
    finally:
        await gw.close()


_NOBODY_CHILD = """
import asyncio, os, pwd, sys
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import MQError, OpenOption, PutOptions
from gateway.wire.mqmd import MQMD
nobody = pwd.getpwnam("nobody")  # imports done as root; the connection is nobody's
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)

async def main():
    c = await connect_local(sys.argv[1])
    body = bytes.fromhex(sys.argv[3])
    try:
        await c.put1(sys.argv[2], MQMD(format="MQGWENV1", persistence=1), body)
        print("put1 ok")
    except MQError as exc:
        print("put1", exc.reason)
    try:
        await c.open(sys.argv[2], OpenOption.OUTPUT)
        print("open ok")
    except MQError as exc:
        print("open", exc.reason)
    try:
        await c.open(sys.argv[2], OpenOption.INPUT_SHARED)
        print("input ok")
    except MQError as exc:
        print("input", exc.reason)
    await c.disconnect()
asyncio.run(main())
"""


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other OS users may traverse (pytest's own are private to root)."""
    public = Path(tempfile.mkdtemp(prefix="qm-hostile-"))
    os.chmod(public, 0o755)
    try:
        yield public
    finally:
        shutil.rmtree(public, ignore_errors=True)


async def test_a_hostile_local_client_cannot_feed_a_backlog(
    tmp_path: Path, public_dir: Path
) -> None:
    """Another OS user on the queue manager's local socket (let in by a chmod, as an
    operator might for a legacy application) is refused the backlog queue (2035); the
    gateway's own user's script is not refused by the queue manager, but what it puts
    is not sealed by the gateway: dead-lettered (2035), never forwarded."""
    if os.getuid() != 0:
        pytest.fail("becoming another OS user needs root: run this test as root")
    gw = await _start(tmp_path)
    server = QueueManagerServer(gw.qm, public_dir / "qm.sock")
    await server.start()
    try:
        os.chmod(server.path, 0o666)
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", _NOBODY_CHILD, str(server.path), BACKLOG,
             _forged_body(b"from nobody").hex()],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:3] == [
            f"put1 {Reason.NOT_AUTHORIZED}", f"open {Reason.NOT_AUTHORIZED}",
            f"input {Reason.NOT_AUTHORIZED}",
        ], done.stdout
        own = await connect_local(server.path)
        try:
            handle = await own.open(BACKLOG, OpenOption.OUTPUT)
            await handle.put(MQMD(format=BACKLOG_FORMAT, persistence=1),
                             _forged_body(b"from a script"))
            await handle.close()
        finally:
            await own.disconnect()
        await _publish(gw, b"genuine")
        await _genuine_only(gw, b"genuine")
        assert await _dead_letters(gw, 1) == [Reason.NOT_AUTHORIZED]
        assert gw.service.sink_backlogs.counters()[SINK].dead_lettered == {
            Reason.NOT_AUTHORIZED: 1
        }
    finally:
        await server.stop()
        await gw.close()


async def test_a_put_refused_to_another_user_names_the_queue(tmp_path: Path) -> None:
    """The refusal the local socket gives another user (without root: the server's
    decision function with a foreign uid, as tests/mq/test_qm_client.py does)."""
    from gateway.mq.embedded import qm_server

    gw = await _start(tmp_path)
    server = QueueManagerServer(gw.qm, tmp_path / "qm.sock")
    try:
        session = qm_server._Session(server, None)
        session.uid, session.user = os.getuid() + 1, "other"
        session.conn = await gw.qm.connect()
        for op, req in (("open", {"q_name": BACKLOG, "options": int(OpenOption.OUTPUT)}),
                        ("put1", {"q_name": BACKLOG})):
            with pytest.raises(MQError) as info:
                await session.call(op, req, b"" if op == "open" else _packed())
            assert info.value.reason == Reason.NOT_AUTHORIZED, op
            assert BACKLOG in str(info.value)
        await session.end()
    finally:
        await gw.close()


def _packed() -> bytes:
    from gateway.mq.embedded.qm_protocol import pack_message

    return pack_message(MQMD(format=BACKLOG_FORMAT), _forged_body(b"x"))


# ----------------------------------------------- the gateway's own backlog fills a disk ----

#: The free-space watermark and store reserve of the disk test (on a DISK_MB tmpfs).
MIN_FREE_MB = 16
RESERVE_MB = 4
#: Padding after each publication's id: the Kafka backlog reaches the watermark after
#: about (DISK_MB - MIN_FREE_MB - RESERVE_MB) MB / PAD publications.
PAD = 32 * 1024
#: Publications per unit of work of the outside publisher.
PUT_BATCH = 10
#: The phase with Kafka stopped ends once puts have been refused this long (the
#: watermark holds) or after FILL_LIMIT_S.
REFUSED_FOR_S = 5.0
FILL_LIMIT_S = 180.0
RECOVERY_S = 120.0
#: The broker service's batch size (BrokerConfig's default, what FaultWorld runs).
BATCH = 32
#: The publication made after the drain; whatever is sent again arrives before it.
SENTINEL = "after-drain"
SENTINEL_S = 60.0


async def _publish_sentinel(world: FaultWorld) -> None:
    """:data:`SENTINEL` on the outbound stream, from an MQ application on the local
    socket, as the publications before it."""
    conn = await connect_local(world.data_dir, appl_name="hostile-disk-test")
    try:
        msg = rfh_message(
            OUT_STREAM,
            [("MQPSCommand", "Publish"), ("MQPSStreamName", OUT_STREAM),
             ("MQPSTopic", f"F/{SENTINEL}")],
            SENTINEL.encode(),
        )
        msg.md.persistence = 1
        await conn.put1(OUT_STREAM, msg.md, msg.body, PutOptions())
    finally:
        with contextlib.suppress(MQError):
            await conn.disconnect()


class LocalPublisher:
    """An MQ application on the gateway's local socket: padded publications on the
    outbound stream, ``PUT_BATCH`` to a unit of work; an id counts as sent once its
    unit of work committed. A refused put is retried after a pause with new ids (a
    refusal must be retriable: the application waits, as for a full queue)."""

    def __init__(self, world: FaultWorld, ledger: Ledger) -> None:
        self.world = world
        self.paths = (ledger.paths["MQ->Kafka"], ledger.paths["MQ->MQTT"])
        self.refusals: Counter[int] = Counter()
        self.first_refused = 0.0
        self.last_ok = 0.0
        self.stop = asyncio.Event()
        self.n = 0

    async def run(self) -> None:
        conn = await connect_local(self.world.data_dir, appl_name="hostile-disk-test")
        try:
            handle = await conn.open(OUT_STREAM, OpenOption.OUTPUT)
            while not self.stop.is_set():
                ids = [f"d-{self.n + i}" for i in range(PUT_BATCH)]
                self.n += PUT_BATCH
                try:
                    for i in ids:
                        msg = rfh_message(
                            OUT_STREAM,
                            [("MQPSCommand", "Publish"), ("MQPSStreamName", OUT_STREAM),
                             ("MQPSTopic", f"F/{i}")],
                            i.encode() + b"|" + b"." * PAD,
                        )
                        msg.md.persistence = 1
                        await handle.put(msg.md, msg.body, PutOptions(syncpoint=True))
                    await conn.commit()
                except MQError as exc:
                    self.refusals[exc.reason] += 1
                    if not self.first_refused:
                        self.first_refused = time.monotonic()
                    with contextlib.suppress(MQError):
                        await conn.backout()
                    await asyncio.sleep(0.2)
                    continue
                self.first_refused = 0.0
                self.last_ok = time.monotonic()
                for p in self.paths:
                    p.sent.update(ids)
        finally:
            with contextlib.suppress(MQError):
                await conn.disconnect()

    @property
    def refused_for(self) -> float:
        return time.monotonic() - self.first_refused if self.first_refused else 0.0


@pytest.mark.faults
@pytest.mark.slow
async def test_a_backlog_filling_the_disk_stops_at_the_watermark_and_drains_by_itself(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path, small_disk: Path
) -> None:
    """Kafka stopped; an MQ application publishes large messages until the Kafka sink's
    backlog has taken the disk down to the free-space watermark: further puts are
    refused with MQRC_Q_SPACE_NOT_AVAILABLE (2056, retriable), the disk never fills,
    the gateway keeps running. Kafka restarted: the running gateway drains everything by
    itself to both targets, no batch sent again, and no traceback in its log."""
    world = FaultWorld(
        tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
        qm_dir=small_disk / "qm", kafka_extra={"request_timeout_ms": 5000},
        qm_extra={"min_free_mb": MIN_FREE_MB, "store_reserve_mb": RESERVE_MB},
    )
    ledger = Ledger()
    gw = world.gateway()
    kafka_reader = KafkaReader(world, ledger.paths["MQ->Kafka"])
    mqtt_reader = MqttReader(world, ledger.paths["MQ->MQTT"])
    publisher = LocalPublisher(world, ledger)
    kafka_reader.start()
    mqtt_reader.start()
    least_free = DISK_MB * 2**20
    drained_s: float | None = None
    sentinel_seen = False
    task: asyncio.Task[None] | None = None
    outbound = (ledger.paths["MQ->Kafka"], ledger.paths["MQ->MQTT"])
    kafka_down = False
    try:
        async with asyncio.timeout(30):
            await mqtt_reader.ready.wait()
        await first_start(world, gw)
        gw.start()
        assert await wait_ready(gw), gw.log_tail()
        kafka_broker.stop()
        kafka_down = True
        task = asyncio.create_task(publisher.run())
        deadline = time.monotonic() + FILL_LIMIT_S
        while time.monotonic() < deadline and not task.done():
            st = os.statvfs(small_disk)
            least_free = min(least_free, st.f_bavail * st.f_frsize)
            if publisher.refused_for >= REFUSED_FOR_S:
                break
            await asyncio.sleep(0.1)
        publisher.stop.set()
        await asyncio.wait_for(task, 30)
        running_while_full = gw.running
        kafka_broker.restart()
        kafka_down = False
        restarted = time.monotonic()
        if await wait_until(lambda: all(p.complete for p in outbound), RECOVERY_S):
            drained_s = time.monotonic() - restarted
            # a batch sent again after the drain reaches the readers before a publication
            # made now (each sink sends its backlog in order): wait for that one
            for p in outbound:
                p.sent.add(SENTINEL)
            await _publish_sentinel(world)
            sentinel_seen = await wait_until(
                lambda: all(p.received[SENTINEL] for p in outbound), SENTINEL_S)
        log = gw.log_since_start()
        running_after = gw.running
    finally:
        publisher.stop.set()
        if task is not None and not task.done():
            task.cancel()
        if kafka_down:
            kafka_broker.restart()
        gw.kill()
        await kafka_reader.close()
        await mqtt_reader.close()
    table = report(
        tmp_path / "hostile-backlog-disk.json", "hostile: a backlog fills the disk",
        ledger, 1, disk_mb=DISK_MB, min_free_mb=MIN_FREE_MB, reserve_mb=RESERVE_MB,
        pad=PAD, published=len(outbound[0].sent), refusals=dict(publisher.refusals),
        least_free_mb=round(least_free / 2**20, 1),
        drained_after_restart_s=None if drained_s is None else round(drained_s, 1),
        tracebacks=log.count("Traceback"),
    )
    assert publisher.refusals.get(Reason.Q_SPACE_NOT_AVAILABLE), (
        f"no put refused for space (2056): {dict(publisher.refusals)}\n{table}\n"
        f"{gw.log_tail(40)}"
    )
    assert set(publisher.refusals) == {Reason.Q_SPACE_NOT_AVAILABLE}, table
    assert least_free >= RESERVE_MB * 2**20, f"the disk filled up\n{table}"
    assert running_while_full and running_after, gw.log_tail(40)
    assert drained_s is not None, (
        f"not drained {RECOVERY_S:.0f} s after Kafka came back\n{table}\n{gw.log_tail(60)}"
    )
    assert sentinel_seen, f"the publication after the drain did not arrive\n{table}"
    assert_nothing_lost(ledger, table)
    kafka, mqtt = outbound
    assert kafka.duplicated == 0, f"a batch was sent again to Kafka\n{table}"
    # MQTT stayed up: the batch that met the watermark first had already been handed to
    # it directly; its retries hand nothing over, but the one that commits puts its
    # copies on the backlog, which are sent again (docs/operations.md: at most a batch)
    assert mqtt.duplicated <= BATCH, f"MQTT got more than a batch twice\n{table}"
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]
    assert "watermark" in log, gw.log_tail(40)
