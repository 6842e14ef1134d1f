"""The fault suite's world: one ``mqgw run`` child on the embedded queue manager with the
kafka and mqtt plugins, the four persistent paths it carries, the MQ side the test reads
and writes while the gateway is down, and the gateway's lifecycle (first start, clean
recovery runs). The outside clients are in tests/faults/clients.py, the per-path counts
in tests/faults/ledger.py.

Paths (each message's payload is its unique id):

- ``MQ->Kafka`` and ``MQ->MQTT``: MQRFH publications on ``STOCK.STREAM``, put by the
  test process while the gateway is down (the data directory is locked while it runs);
  read by an aiokafka consumer and an MQTT subscriber that stay connected throughout.
- ``MQ->Kafka (exactly-once)`` (``FaultWorld(exactly_once=True)``): the same
  publications through a second kafka plugin instance ``kafka-eos`` with ``delivery:
  exactly_once`` to its own topic, read with ``isolation_level="read_committed"``.
- ``Kafka->MQ`` and ``MQTT->MQ``: records / QoS 1 messages produced by outside clients
  while the gateway runs, published by it on ``BULLETIN.STREAM`` to the MQ subscriber
  queue ``FAULT.SUB`` (an MQRFH2 RegSub registered on the first start), which the test
  drains after the gateway has stopped.

Why the inbound and outbound streams differ: nothing the gateway brings in from Kafka or
MQTT is sent back out, so every count belongs to exactly one path.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.mq.embedded.client import connect_local
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions, QueueAttr
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.faults.ledger import Ledger
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, decode, rfh2_message, rfh_message

QM_NAME = "QM1"
OUT_STREAM = "STOCK.STREAM"
IN_STREAM = "BULLETIN.STREAM"
SUB_Q = "FAULT.SUB"
REPLY_Q = "FAULT.REPLY"
#: The line ``mqgw run`` logs when the queue manager and broker service are up.
STARTED = "INFO gateway.runtime.app: gateway "
#: The plugin instances' start lines (they start concurrently, in either order).
READY = ("plugin instance kafka started", "plugin instance mqtt started")
#: The exactly-once kafka plugin instance of ``FaultWorld(exactly_once=True)``.
EOS_INSTANCE = "kafka-eos"


@dataclass
class FaultWorld:
    """Names and settings of one suite run (unique per run on the shared brokers)."""

    work: Path
    bootstrap: str
    mqtt_host: str
    mqtt_port: int
    tag: str = field(default_factory=lambda: unique("faults"))
    kafka_extra: dict[str, Any] = field(default_factory=dict)
    #: Settings added to the gateway's ``broker:`` section.
    broker_extra: dict[str, Any] = field(default_factory=dict)
    #: The embedded queue manager's directory (default ``work/qm``).
    qm_dir: Path | None = None
    #: Also route the outbound stream through an exactly-once kafka instance.
    exactly_once: bool = False
    #: Run the kafka and mqtt instances in one worker process (``workers:``).
    plugins_in_worker: bool = False
    #: More settings of the ``queue_manager:`` section (e.g. ``min_free_mb``).
    qm_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.qm_dir or self.work / "qm"

    @property
    def kafka_out(self) -> str:
        return f"{self.tag}.out"

    @property
    def kafka_eos_out(self) -> str:
        return f"{self.tag}.eos"

    @property
    def ready_lines(self) -> tuple[str, ...]:
        """The start lines of every plugin instance of :meth:`config`."""
        eos = (f"plugin instance {EOS_INSTANCE} started",) if self.exactly_once else ()
        if self.plugins_in_worker:
            # the worker's own lines (the main process's start lines share the prefix)
            return tuple(f"{r} in worker w1" for r in READY) + eos
        return READY + eos

    @property
    def kafka_in(self) -> str:
        return f"{self.tag}.in"

    @property
    def mqtt_out_filter(self) -> str:
        return f"{self.tag}/out/{OUT_STREAM}/#"

    @property
    def mqtt_in_prefix(self) -> str:
        return f"{self.tag}/in"

    def config(self) -> dict[str, Any]:
        config = self._config()
        if self.exactly_once:
            config["plugins"].append(self._exactly_once_plugin())
        if self.plugins_in_worker:
            config["workers"] = [{"name": "w1", "plugins": ["kafka", "mqtt"]}]
        return config

    def _exactly_once_plugin(self) -> dict[str, Any]:
        """Outbound only (nothing consumed in, so every count stays on one path)."""
        return {
            "name": EOS_INSTANCE,
            "plugin": "kafka",
            "config": {
                "bootstrap_servers": self.bootstrap,
                **self.kafka_extra,
                "delivery": "exactly_once",
                "outbound": {
                    "routes": [
                        {"stream": OUT_STREAM, "topic": "#", "kafka_topic": self.kafka_eos_out}
                    ]
                },
            },
        }

    def _config(self) -> dict[str, Any]:
        return {
            "id": f"mqgw-{self.tag}",
            "queue_manager": {"name": QM_NAME, "data_dir": str(self.data_dir),
                              **self.qm_extra},
            "broker": {
                "store": "pubsub.db",
                "streams": [{"name": OUT_STREAM}, {"name": IN_STREAM}],
                "wait_ms": 100,
                "sink_retry_max_delay": 1.0,
                **self.broker_extra,
            },
            "metrics": {"enabled": False},
            "logging": {"format": "text", "level": "info"},
            "shutdown_timeout": 20.0,
            "plugins": [
                {
                    "name": "kafka",
                    "plugin": "kafka",
                    "config": {
                        "bootstrap_servers": self.bootstrap,
                        **self.kafka_extra,
                        "outbound": {
                            "routes": [
                                {"stream": OUT_STREAM, "topic": "#", "kafka_topic": self.kafka_out}
                            ]
                        },
                        "inbound": {
                            "topics": [{"kafka_topic": self.kafka_in, "stream": IN_STREAM}],
                            "poll_timeout_ms": 100,
                        },
                    },
                },
                {
                    "name": "mqtt",
                    "plugin": "mqtt",
                    "config": {
                        "host": self.mqtt_host,
                        "port": self.mqtt_port,
                        "reconnect_max_delay": 1.0,
                        "outbound": {
                            "prefix": f"{self.tag}/out",
                            "topics": [f"$SYS/STREAM/{OUT_STREAM}/#"],
                        },
                        "inbound": {
                            "filters": [
                                {
                                    "filter": f"{self.mqtt_in_prefix}/#",
                                    "strip_prefix": f"{self.mqtt_in_prefix}/",
                                    "stream": IN_STREAM,
                                }
                            ]
                        },
                    },
                },
            ],
        }

    def gateway(self) -> GatewayProcess:
        self.work.mkdir(parents=True, exist_ok=True)
        path = write_config(self.work / "gateway.yaml", self.config())
        return GatewayProcess(path, self.work / "gateway.log")


# ------------------------------------------------------- the MQ side (gateway down) ----


async def prepare_queue_manager(world: FaultWorld) -> None:
    """Define the subscriber and reply queues and queue the RegSub (answered at start)."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        qm.run_mqsc(
            f"DEFINE QLOCAL({SUB_Q}) MAXDEPTH(500000) REPLACE\n"
            f"DEFINE QLOCAL({REPLY_Q}) REPLACE\n"
            f"DEFINE QLOCAL('{OUT_STREAM}') MAXDEPTH(500000) DEFPSIST(YES) REPLACE\n"
            f"DEFINE QLOCAL('{IN_STREAM}') MAXDEPTH(500000) DEFPSIST(YES) REPLACE\n",
            stop_on_error=True,
        )
        regsub = rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{IN_STREAM}/#"), ("QName", SUB_Q)],
            msg_type=MsgType.REQUEST,
            reply_to_q=REPLY_Q,
            reply_to_q_mgr=QM_NAME,
        )
        conn = await qm.connect()
        try:
            await conn.put1(regsub.queue, regsub.md, regsub.body, PutOptions())
        finally:
            await conn.disconnect()
    finally:
        await qm.close()


async def regsub_answer(world: FaultWorld) -> str:
    """``ok`` or the broker's reason from the RegSub's response (gateway down)."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        replies = await _drain(qm, REPLY_Q)
    finally:
        await qm.close()
    if not replies:
        return "no response"
    answer = decode(replies[0][0], replies[0][1])
    return answer.get("pscr/Completion") or "no pscr"


async def put_publications(world: FaultWorld, ids: list[str]) -> None:
    """Persistent MQRFH publications (payload = id) on the outbound stream, one commit."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        conn = await qm.connect()
        try:
            handle = await conn.open(OUT_STREAM, OpenOption.OUTPUT)
            for i in ids:
                msg = rfh_message(
                    OUT_STREAM,
                    [("MQPSCommand", "Publish"), ("MQPSStreamName", OUT_STREAM),
                     ("MQPSTopic", f"F/{i}")],
                    i.encode(),
                )
                await handle.put(msg.md, msg.body, PutOptions(syncpoint=True))
            await conn.commit()
            await handle.close()
        finally:
            await conn.disconnect()
    finally:
        await qm.close()


async def drain_subscriber(world: FaultWorld) -> list[str]:
    """Ids of every publication on the MQ subscriber queue (destructive; gateway down);
    padding after an id (``id|...``, see ``SteadyFeeds.pad``) is cut off."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        got = await _drain(qm, SUB_Q)
    finally:
        await qm.close()
    return [decode(md, body).payload.decode("utf-8", "replace").partition("|")[0]
            for md, body in got]


async def _drain(qm: EmbeddedQueueManager, queue: str) -> list[tuple[Any, bytes]]:
    conn = await qm.connect()
    out: list[tuple[Any, bytes]] = []
    try:
        handle = await conn.open(queue, OpenOption.INPUT_SHARED)
        while True:
            try:
                m = await handle.get(GetOptions(wait_ms=0, syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            out.append((m.md, m.body))
        await conn.commit()
        await handle.close()
    finally:
        await conn.disconnect()
    return out


async def wait_until(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())


async def wait_ready(
    gw: GatewayProcess, timeout: float = 60, lines: tuple[str, ...] = READY
) -> bool:
    """Until every plugin instance logged its start (False: it died or timed out)."""
    await wait_until(lambda: all(gw.has_logged(r) for r in lines) or not gw.running, timeout)
    return gw.running and all(gw.has_logged(r) for r in lines)


async def first_start(world: FaultWorld, gw: GatewayProcess) -> None:
    """Queues and RegSub defined, one clean run: the RegSub answered, the plugins'
    subscriptions, the gateway's MQTT session and Kafka consumer group exist before any
    traffic (the first-start gap of issue 12 item 9 is not what this suite measures)."""
    await prepare_queue_manager(world)
    gw.start()
    assert await wait_ready(gw, lines=world.ready_lines), gw.log_tail()
    await asyncio.sleep(1.0)
    assert gw.terminate() == 0, gw.log_tail()
    assert await regsub_answer(world) == "ok"


#: How long a clean run waits for the inbound backlog to reach the MQ subscriber queue.
#: A consumer that left its group uncleanly (its gateway killed, or stopped during an
#: outage mid-rejoin) holds the group's rebalance until the broker drops it after its
#: session timeout (45 s); a 5 s wait per run missed that (one failure, 37 of 66 Kafka
#: records still in Kafka after 4 runs, offsets not committed).
INBOUND_S = 60.0


async def _wait_for_depth(world: FaultWorld, depth: int, timeout: float) -> bool:
    """Until the running gateway's subscriber queue holds ``depth`` messages (read over
    its queue manager's local socket), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await connect_local(world.data_dir, appl_name="fault suite")
        except MQError:
            have = -1
        else:
            try:
                handle = await conn.open(SUB_Q, OpenOption.INQUIRE)
                got = await handle.inquire(QueueAttr.CURRENT_Q_DEPTH)
                have = int(got[QueueAttr.CURRENT_Q_DEPTH])
                await handle.close()
            finally:
                await conn.disconnect()
        if have >= depth:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.2)


async def recover_and_count(
    world: FaultWorld, gw: GatewayProcess, ledger: Ledger, rounds: int = 4
) -> None:
    """Clean runs until every outbound id (every ``MQ->`` path of the ledger) is out and
    the MQ subscriber queue holds every inbound id (drained after each clean stop), at
    most ``rounds`` runs."""
    outbound = [p for name, p in ledger.paths.items() if name.startswith("MQ->")]
    inbound = (ledger.paths["Kafka->MQ"], ledger.paths["MQTT->MQ"])
    for _ in range(rounds):
        if not gw.running:
            gw.start()
        assert await wait_ready(gw, lines=world.ready_lines), gw.log_tail()
        await wait_until(lambda: all(p.complete for p in outbound), timeout=60)
        # the inbound backlog (Kafka records, the MQTT session) on the subscriber queue
        owed = sum(len(p.sent - set(p.received)) for p in inbound)
        await _wait_for_depth(world, owed, INBOUND_S)
        assert gw.terminate() == 0, gw.log_tail()
        for payload in await drain_subscriber(world):
            (inbound[0] if payload.startswith("k") else inbound[1]).receive([payload])
        if all(p.complete for p in (*outbound, *inbound)):
            return


