"""SIGKILL after SIGKILL of a multi-instance node's active instance under steady traffic
(docs/operations.md, "High availability"): the harness of tests/examples/
test_multi_instance.py and benchmarks/bench_takeover.py.

The node is a copy of examples/multi-instance, its instances ``mqgw run --multi-instance``
processes (tests/support/instances.py). Four paths under steady traffic, each a sender
and a reader outside the gateway, MQ applications reconnecting to the active instance's
local socket after each takeover:

- MQ -> Kafka and MQ -> MQTT: an MQ application puts one MQRFH publication at a time; a
  Kafka consumer and an MQTT subscriber read them;
- Kafka -> MQ: a Kafka producer produces one record at a time to the inbound topic; an MQ
  application gets the publications from its subscriber queue (HA.FROM.KAFKA);
- request/reply: a Kafka requester produces a request every ``PUT_EVERY_S`` to the route
  ``echo``'s source topic (not waiting for replies); an MQ application echoes each MQ
  request from SVC.ECHO; a Kafka consumer reads the replies.

Each round: traffic seen on every path, SIGKILL of the active instance, the killed one
started again at once (as systemd's ``Restart=always``), the time from the kill to the
first message sent after it arriving on each path.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.devstack.ports import free_ports
from gateway.mq.embedded.client import ClientConnection, connect_local
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.instances import Instance
from tests.support.mq_app import ECHO_PREFIX, reply_md
from tests.support.names import unique
from tests.support.pubsub_messages import decode, rfh_message

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi-instance"
STREAM = "STOCK.STREAM"
#: The example's Kafka -> MQ stream, its MQ subscriber's queue, the echo service's queue.
IN_STREAM, IN_QUEUE, ECHO_QUEUE = "FROM.KAFKA.STREAM", "HA.FROM.KAFKA", "SVC.ECHO"
CONTROL_QUEUE = "SYSTEM.BROKER.CONTROL.QUEUE"
#: Bound on one takeover / one start (the issue's goal is p99 < 10 s; this is a hang).
TAKEOVER_S = 60.0
#: Seconds between the publisher's puts.
PUT_EVERY_S = 0.05


class Sender:
    """What one path's sender sent: when each id was first sent (``put_at``) and the ids
    whose send returned, in order (``committed``)."""

    def __init__(self) -> None:
        self.put_at: dict[str, float] = {}
        #: ``put_at`` as a list, which the checks polled in a thread may slice while the
        #: loop appends (a dict being iterated must not change size)
        self.sends: list[tuple[str, float]] = []
        self.committed: list[str] = []
        self.stop = asyncio.Event()

    def sending(self, ident: str) -> None:
        if ident not in self.put_at:
            self.put_at[ident] = now = time.monotonic()
            self.sends.append((ident, now))

    async def run(self) -> None:
        raise NotImplementedError


class Publisher(Sender):
    """Puts publication ``p<n>`` after ``p<n-1>``'s commit returned (or failed: then
    ``p<n>`` again, on a new connection), recording when each was put."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.data_dir = data_dir

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                conn = await connect_local(self.data_dir, appl_name="ha publisher")
            except Exception:
                await asyncio.sleep(0.05)
                continue
            try:
                handle = await conn.open(STREAM, OpenOption.OUTPUT)
                while not self.stop.is_set():
                    ident = f"p{n:06d}"
                    msg = rfh_message(STREAM, [("MQPSCommand", "Publish"),
                                               ("MQPSStreamName", STREAM),
                                               ("MQPSTopic", f"HA/{ident}")], ident.encode())
                    self.sending(ident)
                    await handle.put(msg.md, msg.body, PutOptions(syncpoint=True))
                    await conn.commit()
                    self.committed.append(ident)
                    n += 1
                    await asyncio.sleep(PUT_EVERY_S)
            except Exception:  # the instance died under us: the same id again
                await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.disconnect(), 2)


class KafkaProducer(Sender):
    """An outside Kafka client: record ``<tag><n>`` after ``<tag><n-1>`` was acknowledged
    (acks=all; a failed send: the same id again), or, with ``wait=False``, one every
    ``PUT_EVERY_S`` without waiting (the requester: requests in flight at the kill).
    ``headers(ident)``: the record's headers (the requester's reply topic, correlation)."""

    def __init__(self, broker: KafkaBroker, topic: str, tag: str, *,
                 reply_topic: str = "") -> None:
        super().__init__()
        self.broker, self.topic, self.tag, self.reply_topic = broker, topic, tag, reply_topic

    def headers(self, ident: str) -> list[tuple[str, bytes]]:
        if not self.reply_topic:
            return []
        return [("mq.reply.topic", self.reply_topic.encode()),
                ("mq.correlation", ident.encode())]

    async def run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.broker.bootstrap, acks="all",
                                    enable_idempotence=True)
        await producer.start()
        try:
            n = 0
            while not self.stop.is_set():
                ident = f"{self.tag}{n:06d}"
                self.sending(ident)
                try:
                    await producer.send_and_wait(self.topic, ident.encode(),
                                                 headers=self.headers(ident))
                except Exception:
                    await asyncio.sleep(0.05)
                    continue
                self.committed.append(ident)
                n += 1
                await asyncio.sleep(PUT_EVERY_S)
        finally:
            await producer.stop()


class MQGetter:
    """An MQ application on the active instance's local socket getting ``queue`` under
    syncpoint (reconnecting after each takeover); ``handle(conn, message)`` before each
    commit."""

    def __init__(self, data_dir: Path, queue: str, appl_name: str) -> None:
        self.data_dir, self.queue, self.appl_name = data_dir, queue, appl_name

    async def handle(self, conn: ClientConnection, md: MQMD, body: bytes) -> None:
        raise NotImplementedError

    async def get_forever(self) -> None:
        while True:
            try:
                conn = await connect_local(self.data_dir, appl_name=self.appl_name)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            try:
                handle = await conn.open(self.queue, OpenOption.INPUT_SHARED)
                while True:
                    try:
                        msg = await handle.get(GetOptions(wait_ms=200, syncpoint=True))
                    except MQError as exc:
                        if exc.reason == Reason.NO_MSG_AVAILABLE:
                            continue
                        raise
                    await self.handle(conn, msg.md, msg.body)
                    await conn.commit()
            except Exception:  # the instance died under us: connect to the next one
                await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.disconnect(), 2)


class Echo(MQGetter, Sender):
    """The MQ service of the route ``echo``: each request on SVC.ECHO answered with
    ``echo:<body>`` to its ReplyToQ@ReplyToQMgr in the same unit of work."""

    def __init__(self, data_dir: Path) -> None:
        MQGetter.__init__(self, data_dir, ECHO_QUEUE, "ha echo service")
        Sender.__init__(self)

    async def handle(self, conn: ClientConnection, md: MQMD, body: bytes) -> None:
        await conn.put1(md.reply_to_q, reply_md(md), ECHO_PREFIX + body,
                        PutOptions(syncpoint=True), q_mgr_name=md.reply_to_q_mgr)

    async def run(self) -> None:
        await self.get_forever()


class Arrivals:
    """What one path delivered: first arrival times, their order, every delivery;
    ``sender``: what was sent on it."""

    sender: Sender

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrived: dict[str, float] = {}
        self.order: list[str] = []
        self.count = 0
        self.ready = asyncio.Event()

    async def run(self) -> None:
        raise NotImplementedError

    def receive(self, ident: str) -> None:
        self.count += 1
        if ident not in self.arrived:
            self.arrived[ident] = time.monotonic()
            self.order.append(ident)


class KafkaReader(Arrivals):
    """An aiokafka consumer of ``topic`` from its beginning (the example's outbound
    topic; the request/reply route's reply topic: ``echo:<id>``)."""

    def __init__(self, broker: KafkaBroker, topic: str, sender: Sender,
                 name: str = "MQ->Kafka", strip: bytes = b"") -> None:
        super().__init__(name)
        self.broker = broker
        self.topic = topic
        self.sender = sender
        self.strip = strip

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(self.topic, bootstrap_servers=self.broker.bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    metadata_max_age_ms=1000)
        await consumer.start()
        try:
            self.ready.set()
            while True:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for r in records:
                        if r.value:
                            value = r.value.removeprefix(self.strip)
                            self.receive(value.decode("utf-8", "replace"))
        finally:
            await consumer.stop()


class Subscriber(Arrivals):
    """A QoS 1 MQTT subscriber to the example's outbound topics."""

    def __init__(self, broker: MosquittoBroker, prefix: str, sender: Sender) -> None:
        super().__init__("MQ->MQTT")
        self.broker = broker
        self.sender = sender
        self.filter = f"{prefix}/{STREAM}/#"

    async def run(self) -> None:
        async with aiomqtt.Client(self.broker.host, self.broker.port,
                                  identifier=unique("ha-sub-"), keepalive=10) as client:
            await client.subscribe(self.filter, qos=1)
            self.ready.set()
            async for msg in client.messages:
                if isinstance(msg.payload, bytes | bytearray):
                    self.receive(bytes(msg.payload).decode("utf-8", "replace"))


class MQReader(MQGetter, Arrivals):
    """An MQ application getting the Kafka -> MQ publications from its subscriber queue
    (registered once, a persistent RegSub in the node's broker store)."""

    def __init__(self, data_dir: Path, sender: Sender) -> None:
        MQGetter.__init__(self, data_dir, IN_QUEUE, "ha subscriber")
        Arrivals.__init__(self, "Kafka->MQ")
        self.sender = sender

    async def handle(self, conn: ClientConnection, md: MQMD, body: bytes) -> None:
        got = decode(md, body)
        if got.get("MQPSCommand") == "Publish":
            self.receive(got.payload.decode("utf-8", "replace"))

    async def register(self, q_mgr: str) -> None:
        """RegSub for ``IN_QUEUE`` on ``IN_STREAM``, every topic."""
        conn = await connect_local(self.data_dir, appl_name="ha subscriber")
        try:
            msg = rfh_message(CONTROL_QUEUE, [
                ("MQPSCommand", "RegSub"), ("MQPSStreamName", IN_STREAM),
                ("MQPSTopic", "*"), ("MQPSQMgrName", q_mgr), ("MQPSQName", IN_QUEUE)],
                reply_to_q_mgr=q_mgr)
            await conn.put1(CONTROL_QUEUE, msg.md, msg.body)
        finally:
            await conn.disconnect()

    async def run(self) -> None:
        self.ready.set()
        await self.get_forever()


async def _until(instance: Instance, what: str, check: object, timeout: float,
                 paths: list[Arrivals] | None = None) -> float:
    try:
        return await asyncio.to_thread(instance.wait_for, what, check, timeout)
    except AssertionError as exc:
        state = "; ".join(f"{p.name}: {len(p.sender.committed)} sent, {len(p.arrived)} "
                          f"arrived" for p in paths or ())
        raise AssertionError(f"{state}\n{exc}") from None


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``values`` (p99: the nearest rank; of 20 values, the largest)."""
    ordered = sorted(values)
    return (statistics.median(ordered),
            ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))])


@dataclass
class TakeoverRun:
    """One node under :meth:`run`'s takeovers; :meth:`close` stops whatever it started."""

    work: Path
    kafka: KafkaBroker
    mqtt: MosquittoBroker
    #: takeover seconds per path name
    takeovers: dict[str, list[float]] = field(default_factory=dict)
    #: takeovers won by the instance restarted after the kill (not the waiting standby)
    reborn_won: int = 0
    #: the publications whose commit returned, in order
    sent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        root = self.work / "multi-instance"
        shutil.copytree(EXAMPLE, root)
        self.config = root / "gateway.yaml"
        listener, port_a, port_b = free_ports(3)
        prefix = unique("ha")
        self.topics = {"out": f"{prefix}.out", "in": f"{prefix}.in",
                       "requests": f"{prefix}.echo.requests", "replies": f"{prefix}.echo.replies"}
        self.env = {
            "MQGW_MQTT_HOST": self.mqtt.host, "MQGW_MQTT_PORT": str(self.mqtt.port),
            "MQGW_LISTENER_PORT": str(listener), "MQGW_MQTT_PREFIX": prefix,
            "MQGW_KAFKA_BOOTSTRAP": self.kafka.bootstrap, "MQGW_KAFKA_TOPIC": self.topics["out"],
            "MQGW_KAFKA_IN_TOPIC": self.topics["in"],
            "MQGW_KAFKA_REQUESTS": self.topics["requests"]}
        self.active = Instance("i0", self.config, port_a, self.env)
        self.standby = Instance("i1", self.config, port_b, self.env)
        self.everyone = [self.active, self.standby]
        data_dir = root / "data" / "qm"
        self.publisher = Publisher(data_dir)
        self.producer = KafkaProducer(self.kafka, self.topics["in"], "k")
        self.requester = KafkaProducer(self.kafka, self.topics["requests"], "r",
                                       reply_topic=self.topics["replies"])
        self.echo = Echo(data_dir)
        self.mq_reader = MQReader(data_dir, self.producer)
        self.paths: list[Arrivals] = [
            KafkaReader(self.kafka, self.topics["out"], self.publisher),
            Subscriber(self.mqtt, prefix, self.publisher),
            self.mq_reader,
            KafkaReader(self.kafka, self.topics["replies"], self.requester,
                        name="request/reply (Kafka)", strip=ECHO_PREFIX)]
        self.senders: list[Sender] = [self.publisher, self.producer, self.requester]
        self.takeovers = {p.name: [] for p in self.paths}
        self.tasks: list[asyncio.Task[None]] = []

    async def _create_topics(self) -> None:
        """The Kafka topics, one partition each (one stream, one order), before any
        client looks for them."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.kafka.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, 1, 1) for t in self.topics.values()])
        finally:
            await admin.close()

    async def run(self, rounds: int) -> None:
        """Start the pair, then ``rounds`` takeovers under traffic, then every message
        sent delivered on every path (else AssertionError)."""
        paths = self.paths
        await self._create_topics()
        self.tasks = [asyncio.create_task(p.run()) for p in paths if p is not self.mq_reader]
        for p in paths:
            if p is not self.mq_reader:
                await asyncio.wait_for(p.ready.wait(), 30)
        active, standby = self.active, self.standby
        active.start()
        await _until(active, "active", lambda: all(
            active.has_logged(f"plugin instance {n} started") for n in ("kafka", "mqtt"))
            and active.role() == "active", TAKEOVER_S)
        await self.mq_reader.register("HA1")
        self.tasks += [asyncio.create_task(t.run()) for t in (self.mq_reader, self.echo)]
        standby.start()
        await _until(standby, "standby", lambda: standby.role() == "standby", TAKEOVER_S)
        feeding = [asyncio.create_task(s.run()) for s in self.senders]
        self.tasks += feeding
        for round_ in range(rounds):
            # traffic flows through the active instance on every path before each kill
            marks = {p.name: len(p.sender.committed) for p in paths}
            await _until(active, "traffic", lambda m=marks: all(
                len(p.sender.committed) > m[p.name] + 3
                and p.sender.committed[m[p.name] + 3] in p.arrived for p in paths),
                TAKEOVER_S, paths)
            killed_at = time.monotonic()
            active.kill()
            # the killed one comes back at once as a new instance (systemd's
            # Restart=always), on its metrics port: usually the next standby
            reborn = Instance(f"i{round_ + 2}", self.config, active.metrics_port, self.env)
            self.everyone.append(reborn)
            reborn.start()
            for p in paths:
                await _until(standby, f"{p.name}: the first message after the takeover",
                             lambda t=killed_at, p=p: any(
                                 at > t and i in p.arrived
                                 for i, at in p.sender.sends[-200:]),
                             TAKEOVER_S, paths)
                first = min(p.arrived[i] for i, at in p.sender.put_at.items()
                            if at > killed_at and i in p.arrived)
                self.takeovers[p.name].append(first - killed_at)
            pair = (standby, reborn)
            await _until(reborn, "one active, one standby", lambda a=pair: sorted(
                str(i.role()) for i in a) == ["active", "standby"], TAKEOVER_S)
            active, standby = pair if pair[0].role() == "active" else pair[::-1]
            self.reborn_won += active is reborn
            self.active, self.standby = active, standby
        for s in self.senders:
            s.stop.set()
        await asyncio.wait_for(asyncio.gather(*feeding), 10)
        self.sent = list(self.publisher.committed)
        await _until(active, "every message", lambda: all(
            i in p.arrived for p in paths for i in p.sender.committed), TAKEOVER_S, paths)

    async def close(self) -> None:
        for s in self.senders:
            s.stop.set()
        for instance in self.everyone:
            if instance.running:
                await asyncio.to_thread(instance.terminate)
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
