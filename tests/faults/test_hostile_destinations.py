"""Hostile input, part of the fault suite: destinations an outside party names (issue 29).

A real ``mqgw run`` process (embedded queue manager, real Mosquitto and Kafka) and
outside parties that try to make it write where it keeps its own messages:

* an MQ application on the gateway's local socket (this test process) registering
  subscriber queues that are aliases of a stream queue or of the dead-letter queue, or a
  queue-manager alias of the gateway's own queue manager -- a loop that turned 8
  publications into 11,313 broker messages;
* an MQ requester of a service route naming a sink's backlog queue, an alias of it, a
  stream queue through a queue-manager alias, or the service queue itself as ReplyToQ,
  with a body in the backlog's own format (a forged publication on the MQTT stream);
* MQTT 5 and Kafka requesters (``mosquitto_pub -V 5``, Kafka's console producer)
  naming the gateway's own topics as Response Topic / ``mq.reply.topic``.

Each is refused with an MQ reason and counted; nothing lands where it was aimed, no
loop starts, the legitimate traffic around it still flows.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.client import ClientQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.plugin_api import Envelope
from gateway.runtime.backlog_format import BACKLOG_FORMAT, encode_backlog_message
from gateway.wire.constants import MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.kafka_console import console_produce, console_records
from tests.support.legacy_network import free_ports
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, rfh_message, rfh_publication
from tests.support.service_client import drain, drain_raw, put, wait_for_queue

pytestmark = [pytest.mark.faults, pytest.mark.mosquitto_clients]

QM = "QM1"
STOCK = "STOCK.STREAM"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
SERVICE_Q, SERVICE_DEST, REPLY_QUEUE = "GW.SVC", "SVC.Q", "MQGW.REPLY"
MQSC = f"""
DEFINE QLOCAL(APP.SUB) REPLACE
DEFINE QLOCAL(APP.REPLY) REPLACE
DEFINE QLOCAL(APP.LATER) REPLACE
DEFINE QLOCAL({SERVICE_Q}) REPLACE
DEFINE QLOCAL({SERVICE_DEST}) REPLACE
DEFINE QALIAS(APP.LOOP) TARGET({STOCK}) REPLACE
DEFINE QALIAS(APP.DLQ) TARGET({DLQ}) REPLACE
DEFINE QALIAS(APP.BACKLOG) TARGET(SYSTEM.MQGW.SINK.mqtt) REPLACE
DEFINE QREMOTE(SELF) RNAME(' ') RQMNAME({QM}) REPLACE
"""
#: Seconds for one MQTT/Kafka round trip through the gateway in these tests.
ARRIVE_S = 60.0


@dataclass
class Hostile:
    gw: GatewayProcess
    qm: ClientQueueManager
    data_dir: Path
    metrics_port: int
    tag: str
    mqtt: MosquittoBroker
    kafka: KafkaBroker

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the gateway's /metrics (0 when the series is absent)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            series, value = line.rsplit(" ", 1)
            sname, _, rest = series.partition("{")
            if sname != name:
                continue
            got = ",".join(sorted(p for p in rest.rstrip("}").split(",") if p))
            if got == want:
                return float(value)
        return 0.0

    def refused(self, entrance: str) -> float:
        """Refusals counted at ``entrance`` for every reason."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as resp:
            text = resp.read().decode()
        prefix = f'mqgw_authorisation_refused_total{{entrance="{entrance}",'
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(prefix))


def _config(tag: str, data_dir: Path, metrics_port: int, mqtt: MosquittoBroker,
            kafka: KafkaBroker) -> dict[str, Any]:
    return {
        "id": f"mqgw-{tag}",
        "queue_manager": {"name": QM, "data_dir": str(data_dir), "mqsc_file": "qm.mqsc"},
        "broker": {"streams": [{"name": STOCK}], "wait_ms": 50},
        "metrics": {"host": "127.0.0.1", "port": metrics_port},
        "logging": {"format": "text", "level": "info"},
        "plugins": [
            {"name": "mqtt", "plugin": "mqtt", "config": {
                "host": mqtt.host, "port": mqtt.port, "reconnect_max_delay": 1.0,
                "outbound": {"prefix": f"{tag}/mq", "topics": [f"$SYS/STREAM/{STOCK}/#"]},
                "inbound": {"filters": [{"filter": f"{tag}/in/#", "stream": STOCK,
                                         "strip_prefix": f"{tag}/in/"}],
                            "dead_letter_topic": f"{tag}/dlq"},
            }},
            {"name": "kafka", "plugin": "kafka", "config": {
                "bootstrap_servers": kafka.bootstrap,
                "outbound": {"routes": [{"stream": STOCK, "kafka_topic": f"{tag}.stock"}]},
                "inbound": {"topics": [{"kafka_topic": f"{tag}.in", "stream": STOCK}],
                            "dead_letter_topic": f"{tag}.dlq", "poll_timeout_ms": 100},
            }},
        ],
        "request_reply": {
            "sweep_interval": 0.2,
            "requests": [
                {"name": "mreq", "plugin": "mqtt", "source": f"{tag}/req/+",
                 "destination": SERVICE_DEST, "timeout": 30},
                {"name": "kreq", "plugin": "kafka", "source": f"{tag}.req",
                 "destination": SERVICE_DEST, "timeout": 30},
            ],
            "services": [
                {"name": "msvc", "queue": SERVICE_Q, "plugin": "mqtt",
                 "target": f"{tag}/svc/req", "replies": f"{tag}/svc/rep"},
            ],
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile(kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Hostile]:
    work = tmp_path_factory.mktemp("hostile-destinations")
    tag = unique("hd")
    (work / "qm.mqsc").write_text(MQSC, encoding="utf-8")
    port = free_ports(["metrics"])["metrics"]
    data_dir = work / "qm"
    path = write_config(work / "gateway.yaml",
                        _config(tag, data_dir, port, mqtt_broker, kafka_broker))
    gw = GatewayProcess(path, work / "gateway.log")
    gw.start()
    try:
        ready = ("plugin instance mqtt started", "plugin instance kafka started")
        async with asyncio.timeout(90):
            while not all(gw.has_logged(r) for r in ready):
                assert gw.running, gw.log_tail()
                await asyncio.sleep(0.1)
        yield Hostile(gw, ClientQueueManager(data_dir), data_dir, port, tag, mqtt_broker,
                      kafka_broker)
    finally:
        gw.terminate()


# ------------------------------------------------------------------ MQ helpers --------


def regsub(queue: str, q_mgr: str = "", user: str = "app1") -> Any:
    return rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "*"),
         ("MQPSQName", queue), ("MQPSQMgrName", q_mgr)],
        reply_to_q="APP.REPLY", reply_to_q_mgr="", msg_type=MsgType.REQUEST,
        user_identifier=user,
    )


async def answer(h: Hostile, msg: Any, *, set_identity: bool = False) -> str:
    """Put a command and return MQPSReason of its response."""
    await put(h.qm, msg, set_identity=set_identity)
    (resp,) = await wait_for_queue(h.qm, "APP.REPLY", 1, timeout=30)
    return resp.get("MQPSReason") or ""


async def publish_and_count(h: Hostile, sub_queue: str, count: int) -> None:
    """Publish ``count`` publications and a sentinel; the subscriber gets exactly them,
    and the broker got exactly that many messages: nothing came back to it."""
    before = h.metric("mqgw_broker_messages_total")
    for i in range(count):
        await put(h.qm, rfh_publication(STOCK, "Stock/IBM", f"p{i}".encode()))
    got = await wait_for_queue(h.qm, sub_queue, count, timeout=30)
    assert sorted(m.payload for m in got) == sorted(f"p{i}".encode() for i in range(count))
    await put(h.qm, rfh_publication(STOCK, "Stock/IBM", b"sentinel"))
    (last,) = await wait_for_queue(h.qm, sub_queue, 1, timeout=30)
    assert last.payload == b"sentinel"
    # A loop would have put deliveries back on the stream queue ahead of the sentinel.
    handled = h.metric("mqgw_broker_messages_total") - before
    assert handled == count + 1, f"the broker got {handled} messages for {count + 1} put"


async def dead_letters(h: Hostile) -> list[tuple[int, str, MQMD, bytes]]:
    """(MQDLH Reason, DestQName, inner MQMD, inner body) of what the DLQ holds now; every
    message there must carry an MQDLH."""
    out = []
    for m in await drain_raw(h.qm, DLQ):
        dlh, md, body = unwrap_from_dlq(m.md, m.body)
        out.append((dlh.reason, dlh.dest_q_name.strip(), md, body))
    return out


# ------------------------------------------------------------------ subscriber queues --


async def test_subscriber_queues_through_aliases_never_loop(hostile: Hostile) -> None:
    h = hostile
    await drain(h.qm, DLQ)
    # This process runs as the gateway's OS user: trusted as the gateway itself, and
    # still never given its own queues (MQRCCF_Q_NAME_ERROR).
    for q_mgr, queue in (("", "APP.LOOP"), ("SELF", STOCK), ("", "APP.DLQ"),
                         ("SELF", "APP.LOOP")):
        reason = await answer(h, regsub(queue, q_mgr))
        assert reason == str(int(Reason.Q_NAME_ERROR)), (queue, q_mgr, h.gw.log_tail())
    assert await answer(h, regsub("APP.SUB")) == "0"
    await publish_and_count(h, "APP.SUB", 8)
    assert await dead_letters(h) == []  # nothing was put there, with or without an MQDLH


async def test_an_application_of_its_own_identity_is_refused_as_not_authorised(
    hostile: Hostile,
) -> None:
    h = hostile
    await drain(h.qm, DLQ)
    before = h.refused("mq")
    for q_mgr, queue in (("", "APP.LOOP"), ("SELF", STOCK), ("", "APP.DLQ")):
        reason = await answer(h, regsub(queue, q_mgr, user="app1"), set_identity=True)
        assert reason == str(int(Reason.CF_NOT_AUTHORIZED)), (queue, q_mgr)
    letters = await dead_letters(h)
    assert [(r, q) for r, q, _, _ in letters] == [(3081, CONTROL)] * 3
    assert h.refused("mq") - before == 3


async def test_a_subscription_whose_queue_becomes_an_alias_is_removed(
    hostile: Hostile,
) -> None:
    h = hostile
    assert await answer(h, regsub("APP.LATER")) == "0"
    # The operator redefines the queue as an alias of the stream queue, on the running
    # gateway, with `mqgw qm mqsc` (another process, through the socket).
    script = f"DELETE QLOCAL(APP.LATER)\nDEFINE QALIAS(APP.LATER) TARGET({STOCK})\n"
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "qm", "mqsc", "--data-dir",
         str(h.data_dir)], input=script.encode(),
        capture_output=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    async with asyncio.timeout(30):
        while not h.gw.has_logged("subscription(s) removed: queue APP.LATER changed"):
            await asyncio.sleep(0.05)
    await publish_and_count(h, "APP.SUB", 3)  # APP.SUB still subscribed; no loop


# ------------------------------------------------------------------ service routes -----


@contextlib.asynccontextmanager
async def mqtt_client(
    h: Hostile, topic: str, on_message: Callable[[aiomqtt.Client, aiomqtt.Message], Awaitable[None]]
) -> AsyncIterator[None]:
    """An aiomqtt (MQTT 5) client subscribed to ``topic`` that hands every message to
    ``on_message`` while the block runs."""
    async with aiomqtt.Client(h.mqtt.host, h.mqtt.port, protocol=aiomqtt.ProtocolVersion.V5,
                              identifier=unique("outsider")) as client:
        await client.subscribe(topic, qos=1)

        async def read() -> None:
            async for message in client.messages:
                await on_message(client, message)

        task = asyncio.create_task(read())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def mqtt_responder(h: Hostile) -> AsyncIterator[list[bytes]]:
    """An MQTT 5 responder that answers every request on the service route's target
    with the request's own body: what a forger hopes the reply will carry."""
    seen: list[bytes] = []

    async def answer(client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        seen.append(bytes(message.payload))  # type: ignore[arg-type]
        props = message.properties
        response_topic = getattr(props, "ResponseTopic", "")
        if not response_topic:
            return  # a datagram: nothing to answer
        reply = Properties(PacketTypes.PUBLISH)
        reply.CorrelationData = getattr(props, "CorrelationData", b"")
        await client.publish(response_topic, message.payload, qos=1, properties=reply)

    async with mqtt_client(h, f"{h.tag}/svc/req", answer):
        yield seen


@contextlib.asynccontextmanager
async def mqtt_watch(h: Hostile, topic: str) -> AsyncIterator[list[tuple[str, bytes]]]:
    """Everything published on ``topic`` (a filter) while the block runs."""
    got: list[tuple[str, bytes]] = []

    async def keep(client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        got.append((str(message.topic), bytes(message.payload)))  # type: ignore[arg-type]

    async with mqtt_client(h, topic, keep):
        yield got


def forged_envelope(h: Hostile) -> bytes:
    """A body in the sink backlog's own format: a 'price' on the MQTT stream topic."""
    return encode_backlog_message(Envelope(stream=STOCK, topic="Stock/FORGED",
                                           payload=b"forged price 0.01"))


async def service_request(h: Hostile, reply_q: str, reply_q_mgr: str, body: bytes) -> None:
    conn = await h.qm.connect()
    try:
        md = MQMD(msg_type=MsgType.REQUEST, reply_to_q=reply_q, reply_to_q_mgr=reply_q_mgr,
                  format=BACKLOG_FORMAT, user_identifier="app1")
        await conn.put1(SERVICE_Q, md, body, PutOptions(set_identity_context=True))
    finally:
        await conn.disconnect()


async def test_service_requests_naming_the_gateways_own_queues_are_refused(
    hostile: Hostile,
) -> None:
    h = hostile
    await drain(h.qm, DLQ)
    before = h.refused("request_reply:msvc")
    forged = forged_envelope(h)
    targets = [("SYSTEM.MQGW.SINK.mqtt", ""), ("APP.BACKLOG", ""), (STOCK, "SELF"),
               (SERVICE_Q, ""), (REPLY_QUEUE, QM), ("APP.LOOP", "")]
    async with mqtt_watch(h, f"{h.tag}/mq/#") as stream, mqtt_responder(h) as seen:
        for queue, q_mgr in targets:
            await service_request(h, queue, q_mgr, forged)
        await service_request(h, "APP.REPLY", "", b"a fair request")
        (reply,) = await wait_for_queue(h.qm, "APP.REPLY", 1, timeout=ARRIVE_S)
        assert reply.payload == b"a fair request"
        # Only the fair request reached the responder: the others never left MQ.
        assert seen == [b"a fair request"]
        # The MQTT stream carries only what is published on the stream: a sentinel.
        await put(h.qm, rfh_publication(STOCK, "Stock/SENTINEL", b"sentinel"))
        async with asyncio.timeout(ARRIVE_S):
            while not any(p == b"sentinel" for _, p in stream):
                await asyncio.sleep(0.05)
        assert [p for _, p in stream] == [b"sentinel"], stream
    letters = await dead_letters(h)
    assert [(r, q) for r, q, _, _ in letters] == [(2035, SERVICE_Q)] * len(targets)
    assert all(body == forged for _, _, _, body in letters)
    assert h.refused("request_reply:msvc") - before == len(targets)


# ------------------------------------------------------------------ requester routes ---


class Echo:
    """The MQ service behind the requester routes (this process, on the socket)."""

    def __init__(self, h: Hostile) -> None:
        self.h = h
        self.requests: list[bytes] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        conn = await self.h.qm.connect()
        try:
            handle = await conn.open(SERVICE_DEST, OpenOption.INPUT_SHARED)
            while not self.stop.is_set():
                try:
                    msg = await handle.get(GetOptions(wait_ms=100))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        continue
                    raise
                self.requests.append(msg.body)
                md = MQMD(msg_type=MsgType.REPLY, correl_id=msg.md.msg_id,
                          format=msg.md.format)
                await conn.put1(msg.md.reply_to_q, md, b"echo:" + msg.body,
                                q_mgr_name=msg.md.reply_to_q_mgr)
        finally:
            await conn.disconnect()


@contextlib.asynccontextmanager
async def echo_service(h: Hostile) -> AsyncIterator[Echo]:
    echo = Echo(h)
    task = asyncio.create_task(echo.run())
    try:
        yield echo
    finally:
        echo.stop.set()
        await task


def mosquitto_request(h: Hostile, topic: str, payload: str, response_topic: str) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", h.mqtt.host, "-p", str(h.mqtt.port), "-V", "5", "-q", "1",
         "-t", topic, "-m", payload, "-D", "PUBLISH", "response-topic", response_topic,
         "-D", "PUBLISH", "correlation-data", payload],
        check=True, timeout=30,
    )


async def test_mqtt_requesters_cannot_choose_the_gateways_topics(hostile: Hostile) -> None:
    h = hostile
    t = h.tag
    before = h.refused("request_reply:mreq")
    forbidden = [
        f"{t}/mq/STOCK.STREAM/Stock/IBM",  # the instance's outbound stream topics
        f"{t}/dlq/x",  # its dead-letter topic
        f"{t}/in/Stock/IBM",  # an inbound filter: the reply would be published into MQ
        f"{t}/req/again",  # the route's own source: the reply would be a request
        f"{t}/svc/rep",  # a service route's replies topic
    ]
    async with (echo_service(h) as echo, mqtt_watch(h, f"{t}/#") as seen):
        for i, topic in enumerate(forbidden):
            await asyncio.to_thread(mosquitto_request, h, f"{t}/req/{i}", f"bad{i}", topic)
        await asyncio.to_thread(mosquitto_request, h, f"{t}/req/ok", "fair", f"{t}/answers")
        async with asyncio.timeout(ARRIVE_S):
            while not any(topic == f"{t}/answers" for topic, _ in seen):
                await asyncio.sleep(0.05)
        # Every bad request is dead-lettered (reason 2035) before the fair one is taken.
        dead = [topic for topic, _ in seen if topic.startswith(f"{t}/dlq/")]
        assert sorted(dead) == sorted(f"{t}/dlq/{t}/req/{i}" for i in range(len(forbidden)))
        written = {topic for topic, _ in seen} & set(forbidden)
        assert not written, f"replies written to {written}"
        assert echo.requests == [b"fair"]
    assert h.refused("request_reply:mreq") - before == len(forbidden)


def kafka_requests(h: Hostile, records: list[tuple[str, str]]) -> None:
    """Kafka's console producer: one request per (reply topic, value) on the route."""
    console_produce(h.kafka.bootstrap, f"{h.tag}.req",
                    [({"mq.reply.topic": reply, "mq.correlation": value}, value)
                     for reply, value in records])


async def test_kafka_requesters_cannot_choose_the_gateways_topics(hostile: Hostile) -> None:
    h = hostile
    t = h.tag
    before = h.refused("request_reply:kreq")
    forbidden = [
        f"{t}.stock",  # the outbound stream topic
        f"mqgw-retained.{STOCK}",  # a compacted retained topic (the default template)
        f"{t}.dlq",  # the dead-letter topic
        f"{t}.in",  # the inbound topic: the reply would be published into MQ
        f"{t}.req",  # the route's own source
        "__consumer_offsets",  # Kafka's own
    ]
    async with echo_service(h) as echo:
        await asyncio.to_thread(
            kafka_requests, h,
            [*((topic, f"bad{i}") for i, topic in enumerate(forbidden)), (f"{t}.answers", "fair")],
        )
        (answer,) = await asyncio.to_thread(console_records, h.kafka.bootstrap,
                                            f"{t}.answers", 1, ARRIVE_S)
        assert answer.value == "echo:fair"
        assert echo.requests == [b"fair"]
    dead = await asyncio.to_thread(console_records, h.kafka.bootstrap, f"{t}.dlq",
                                   len(forbidden), ARRIVE_S)
    assert sorted(r.value for r in dead) == sorted(f"bad{i}" for i in range(len(forbidden)))
    assert {r.headers.get("mq.dlh.reason") for r in dead} == {"2035"}
    assert h.refused("request_reply:kreq") - before == len(forbidden)

