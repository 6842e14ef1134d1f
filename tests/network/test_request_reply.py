"""Issue 14's "Done when": request/reply across MQ, Kafka and MQTT on a network of
processes (tests/support/rr_network.py), the gateway being one queue manager of it::

    DEMO:  GW (mqgw run)  QMA (SVC.QUOTE echo, SVC.IDLE)  QMB (bridge)  TESTER (this test)
    OTHER: QMB  QMC (Q3 echo)

Clients are outside the gateway: ``mosquitto_pub``/``mosquitto_sub -V 5`` (Response
Topic + Correlation Data), Kafka's console producer/consumer (headers via
``parse.headers``/``print.headers``), MQ applications on QMA/QMC (``tests.support.mq_app``
processes) and on TESTER (this process). The responders the gateway calls as a service
provider are the test itself: an aiokafka consumer/producer (GW.PRICING) and an aiomqtt
MQTT 5 client (GW.WEATHER) — both must echo a 24-byte binary correlation token, which
neither console tool can carry (mosquitto_pub takes correlation data as text).

One network for the module (the gateway tests); the tests that stop GW run last. The
first test checks the network alone (GW as a plain queue manager): the routes the
gateway's tests rely on exist before any gateway code is involved.

Over 500 lines on purpose: one module is one network (its fixture starts six processes,
~15 s), and the outside-client helpers (mosquitto, Kafka console tools, the responders)
serve only these tests. tests/network/test_seed_figure.py has near relatives of the
mosquitto helpers; a shared tests/support home for both is left to a later change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.wire.constants import MsgType, Persistence, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.kafka_console import ConsoleRecord, console_produce, console_records
from tests.support.mq_app import ECHO_PREFIX
from tests.support.names import unique
from tests.support.rr_network import (
    APP_REPLY,
    DLQ,
    GW,
    GW_PRICING,
    GW_WEATHER,
    MYQ3,
    QMA,
    QMC,
    REPLY_ALIAS,
    REPLY_QM_ALIAS,
    REPLY_QUEUE,
    SVC_HELD,
    SVC_IDLE,
    SVC_QUOTE,
    TESTER_ALIAS,
    RRNetwork,
    start_rr_network,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
needs_mosquitto_clients = pytest.mark.mosquitto_clients

#: Bound of every wait for a message that must arrive.
ARRIVE_S = 30.0
#: How long a "nothing more arrives" check waits.
QUIET_S = 2.0
#: The timeout of the route to SVC.IDLE (nobody serves it).
IDLE_TIMEOUT_S = 3.0
UNKNOWN_QM = "NOWHERE.QM"
#: A queue QMA does not have: requests to it are dead-lettered there (2085).
NO_SUCH_Q = "NO.SUCH.Q"


# ---------------------------------------------------------------- the network alone -----


async def test_the_network_routes_replies_home_through_the_aliases(tmp_path: Path) -> None:
    """Without gateway code: GW's queue manager puts requests naming its reply-to alias;
    the echo replies of QMA (same cluster) and QMC (other cluster, via QMB) reach
    MQGW.REPLY on GW; GW's reply via TESTER's QM alias TESTREPLY reaches APP.REPLY; an
    unknown ReplyToQMgr fails on GW with 2087; TESTER reaches MQGW.REPLY via GWREPLY."""
    net = await start_rr_network(tmp_path, gateway=False,
                                 extra_mqsc={GW: f"DEFINE QLOCAL({REPLY_QUEUE}) REPLACE\n"})
    try:
        assert net.gw_node is not None
        gw = net.gw_node.qm
        sent: dict[str, MQMD] = {}
        async with await gw.connect() as conn:
            for q in (SVC_QUOTE, MYQ3):
                md = MQMD(format="MQSTR", msg_type=MsgType.REQUEST, reply_to_q=REPLY_ALIAS,
                          persistence=Persistence.PERSISTENT)
                sent[q] = await conn.put1(q, md, q.encode())
                # the reply-to alias is resolved at put
                assert (sent[q].reply_to_q, sent[q].reply_to_q_mgr) == (REPLY_QUEUE,
                                                                      REPLY_QM_ALIAS)
            h = await conn.open(REPLY_QUEUE, OpenOption.INPUT_SHARED)
            got = {}
            for _ in sent:
                m = await h.get(GetOptions(wait_ms=int(ARRIVE_S * 1000)))
                got[m.md.correl_id] = m
        for q, md in sent.items():
            reply = got.get(md.msg_id)
            assert reply is not None, f"no reply to the request to {q} on {REPLY_QUEUE}@GW"
            assert reply.body == ECHO_PREFIX + q.encode()
            assert reply.md.msg_type == MsgType.REPLY
        # an MQ application of the cluster calls a service on GW, naming its QM alias
        req = await net.put(GW_PRICING, MQMD(format="MQSTR", msg_type=MsgType.REQUEST,
                                             reply_to_q=APP_REPLY,
                                             reply_to_q_mgr=TESTER_ALIAS), b"price")
        async with await gw.connect() as conn:
            h = await conn.open(GW_PRICING, OpenOption.INPUT_SHARED)
            m = await h.get(GetOptions(wait_ms=int(ARRIVE_S * 1000)))
            assert (m.md.reply_to_q, m.md.reply_to_q_mgr) == (APP_REPLY, TESTER_ALIAS)
            await conn.put1(m.md.reply_to_q, MQMD(format="MQSTR", msg_type=MsgType.REPLY,
                                                  correl_id=m.md.msg_id),
                            b"118.50", q_mgr_name=m.md.reply_to_q_mgr)
            # a ReplyToQMgr nothing resolves fails the put on GW (the gateway dead-letters)
            with pytest.raises(MQError) as failed:
                await conn.put1(APP_REPLY, MQMD(format="MQSTR", msg_type=MsgType.REPLY),
                                b"lost", q_mgr_name=UNKNOWN_QM)
            assert failed.value.reason == Reason.UNKNOWN_REMOTE_Q_MGR
        rep = await net.get(APP_REPLY, ARRIVE_S, "the reply to TESTER's request")
        assert rep.body == b"118.50" and rep.md.correl_id == req.msg_id
        # a cluster member answers the gateway through GWREPLY (the restart test's path)
        await net.put(REPLY_QUEUE, MQMD(format="MQSTR", msg_type=MsgType.REPLY), b"held",
                      REPLY_QM_ALIAS)
        async with await gw.connect() as conn:
            h = await conn.open(REPLY_QUEUE, OpenOption.INPUT_SHARED)
            assert (await h.get(GetOptions(wait_ms=int(ARRIVE_S * 1000)))).body == b"held"
    finally:
        await net.close()


# ---------------------------------------------------------------- the gateway network -----


@dataclass
class RR:
    """The running network plus the names the tests use on Kafka and MQTT."""

    net: RRNetwork
    kafka: KafkaBroker
    mqtt: MosquittoBroker
    base: str  # MQTT topic base
    prefix: str  # Kafka topic prefix

    def t(self, suffix: str) -> str:
        return f"{self.base}/{suffix}"

    def k(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"


def _plugins(kafka: KafkaBroker, mqtt: MosquittoBroker) -> list[dict[str, Any]]:
    return [
        {"name": "kafka", "plugin": "kafka",
         "config": {"bootstrap_servers": kafka.bootstrap}},
        {"name": "mqtt", "plugin": "mqtt",
         "config": {"host": mqtt.host, "port": mqtt.port, "client_id": unique("rr-gw-"),
                    "protocol": "5"}},
    ]


def _routes(base: str, prefix: str) -> dict[str, Any]:
    """The ``request_reply:`` routes (spec section 2) of the module's gateway."""
    return {
        "requests": [
            {"name": "mqtt-quote", "plugin": "mqtt", "source": f"{base}/quote/req/#",
             "destination": SVC_QUOTE},
            {"name": "mqtt-quote-qm", "plugin": "mqtt", "source": f"{base}/quoteqm/req/#",
             "destination": f"{SVC_QUOTE}@{QMA}", "correlation": "correl_id"},
            {"name": "kafka-q3", "plugin": "kafka", "source": f"{prefix}.q3.requests",
             "destination": MYQ3},
            {"name": "mqtt-idle", "plugin": "mqtt", "source": f"{base}/idle/req/#",
             "destination": SVC_IDLE, "timeout": IDLE_TIMEOUT_S},
            {"name": "mqtt-held", "plugin": "mqtt", "source": f"{base}/held/req/#",
             "destination": SVC_HELD, "timeout": 300.0},
            {"name": "mqtt-noq", "plugin": "mqtt", "source": f"{base}/noq/req/#",
             "destination": f"{NO_SUCH_Q}@{QMA}", "timeout": 120.0},
        ],
        "services": [
            {"name": "pricing", "queue": GW_PRICING, "plugin": "kafka",
             "target": f"{prefix}.pricing.requests", "replies": f"{prefix}.pricing.replies"},
            {"name": "weather", "queue": GW_WEATHER, "plugin": "mqtt",
             "target": f"{base}/weather/req", "replies": f"{base}/weather/rep"},
        ],
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rr(kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker,
             tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RR]:
    root = tmp_path_factory.mktemp("rr")
    base, prefix = unique("rr"), unique("rr.")
    net = await start_rr_network(root, plugins=_plugins(kafka_broker, mqtt_broker),
                                 request_reply=_routes(base, prefix))
    try:
        yield RR(net, kafka_broker, mqtt_broker, base, prefix)
    finally:
        await net.close()


# ---------------------------------------------------------------- outside clients -----


def mosquitto_pub(rr: RR, topic: str, payload: str, *extra: str) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", rr.mqtt.host, "-p", str(rr.mqtt.port), "-V", "5", "-q", "1",
         "-t", topic, "-m", payload, *extra],
        check=True, timeout=30,
    )


def mqtt_request(rr: RR, topic: str, payload: str, response_topic: str,
                 correlation: str) -> None:
    """An MQTT 5 request: Response Topic and Correlation Data (``-D PUBLISH``)."""
    mosquitto_pub(rr, topic, payload, "-D", "PUBLISH", "response-topic", response_topic,
                  "-D", "PUBLISH", "correlation-data", correlation)


async def mosquitto_sub(rr: RR, topic: str) -> asyncio.subprocess.Process:
    """``mosquitto_sub -V 5`` printing ``topic|correlation data|payload`` per message,
    returned once it is subscribed (a probe publication came back)."""
    probe = unique("rr-probe/")
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", rr.mqtt.host, "-p", str(rr.mqtt.port), "-V", "5", "-q", "1",
        "-t", topic, "-t", probe, "-F", "%t|%D|%p", stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        while True:
            await asyncio.to_thread(mosquitto_pub, rr, probe, "probe")
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(f"{probe}|".encode()), line
            return proc


async def mqtt_lines(proc: asyncio.subprocess.Process, count: int, timeout: float,
                     what: str, rr: RR) -> list[str]:
    """``count`` lines of ``mosquitto_sub`` (then QUIET_S more, to catch a duplicate);
    AssertionError naming ``what`` when fewer arrive within ``timeout``."""
    assert proc.stdout is not None
    out: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while len(out) < count:
                line = await proc.stdout.readline()
                if not line:
                    break
                out.append(line.decode(errors="replace").rstrip("\n"))
    if len(out) == count:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(QUIET_S):
                line = await proc.stdout.readline()
                if line:
                    out.append(line.decode(errors="replace").rstrip("\n"))
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    if len(out) < count:
        raise AssertionError(f"{what}: {len(out)} of {count} MQTT messages within "
                             f"{timeout:.0f} s: {out}\n{rr.net.log_tails()}")
    return out


def kafka_request(rr: RR, topic: str, value: str, headers: dict[str, str]) -> None:
    """Kafka's console producer: one record with ``headers`` (``parse.headers``)."""
    console_produce(rr.kafka.bootstrap, topic, [(headers, value)])


def kafka_console_records(rr: RR, topic: str, count: int, timeout_s: float
                          ) -> list[ConsoleRecord]:
    """Kafka's console consumer: ``count`` records of ``topic`` with headers and key."""
    return console_records(rr.kafka.bootstrap, topic, count, timeout_s)


async def replied_at(rr: RR, name: str, queue: str, body: bytes) -> list[str]:
    """The fields of the ``REPLIED`` line (tests/support/mq_app.py) the echo responder of
    ``name`` logged for the request ``body`` on ``queue``: queue, request MsgId, reply
    CorrelId (hex), request Report, ReplyToQ@ReplyToQMgr."""
    deadline = time.monotonic() + ARRIVE_S
    proc = rr.net.process(name)
    while True:
        for line in proc.log_since_start().splitlines():
            fields = line.split()
            if fields[:2] == ["REPLIED", queue] and fields[-1] == body.hex():
                return fields[1:-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"the echo responder on {queue}@{name} never replied\n"
                                 f"{rr.net.log_tails()}")
        await asyncio.sleep(0.2)


def request_md(reply_to_q_mgr: str = TESTER_ALIAS, **kw: Any) -> MQMD:
    return MQMD(format="MQSTR", msg_type=MsgType.REQUEST, reply_to_q=APP_REPLY,
                reply_to_q_mgr=reply_to_q_mgr, persistence=Persistence.PERSISTENT, **kw)


@contextlib.asynccontextmanager
async def kafka_responder(rr: RR, topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=rr.kafka.bootstrap,
                                group_id=unique("rr-responder-"),
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


async def next_record(consumer: AIOKafkaConsumer, what: str) -> Any:
    try:
        return await asyncio.wait_for(consumer.getone(), ARRIVE_S)
    except TimeoutError:
        raise AssertionError(f"{what}: no Kafka record within {ARRIVE_S:.0f} s") from None


async def kafka_reply(rr: RR, topic: str, value: bytes, correlation: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=rr.kafka.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, headers=[("mq.correlation", correlation)])
    finally:
        await producer.stop()


# ---------------------------------------------------------------- the gateway as requester -----


@needs_mosquitto_clients
async def test_mqtt5_request_to_a_cluster_queue_on_qma_replies_through_the_reply_to_alias(
    rr: RR,
) -> None:
    req, resp = rr.t("quote/req/IBM"), rr.t("quote/resp/client1")
    sub = await mosquitto_sub(rr, resp)
    await asyncio.to_thread(mqtt_request, rr, req, "IBM", resp, "corr-quote-1")
    # the echo service on QMA (cluster queue SVC.QUOTE) answered the gateway's request ...
    _, msg_id, correl_id, report, reply_to = await replied_at(rr, QMA, SVC_QUOTE, b"IBM")
    assert correl_id == msg_id, "route correlation msg_id: the reply's CorrelId is the MsgId"
    assert not int(report) & Report.PASS_CORREL_ID
    assert int(report) & Report.EXCEPTION and int(report) & Report.EXPIRATION
    assert reply_to == f"{REPLY_QUEUE}@{REPLY_QM_ALIAS}", "resolved by GW's reply-to alias"
    # ... and the reply came back through MQGW.REPLY.ALIAS -> MQGW.REPLY@GWREPLY -> GW
    got = await mqtt_lines(sub, 1, ARRIVE_S, "the reply to the MQTT 5 request", rr)
    assert got == [f"{resp}|corr-quote-1|{ECHO_PREFIX.decode()}IBM"], got


@needs_mosquitto_clients
async def test_mqtt5_request_to_queue_at_qmgr_with_pass_correl_id(rr: RR) -> None:
    req, resp = rr.t("quoteqm/req/HUR"), rr.t("quoteqm/resp/client1")
    sub = await mosquitto_sub(rr, resp)
    await asyncio.to_thread(mqtt_request, rr, req, "HUR", resp, "corr-quote-2")
    # destination SVC.QUOTE@QMA; PASS_CORREL_ID: the echo copies the request's CorrelId
    _, msg_id, correl_id, report, _ = await replied_at(rr, QMA, SVC_QUOTE, b"HUR")
    assert int(report) & Report.PASS_CORREL_ID
    assert correl_id == msg_id, "correl_id mode: the token is both MsgId and CorrelId"
    got = await mqtt_lines(sub, 1, ARRIVE_S, "the reply to the PASS_CORREL_ID request", rr)
    assert got == [f"{resp}|corr-quote-2|{ECHO_PREFIX.decode()}HUR"], got


async def test_kafka_request_to_a_queue_in_cluster_other_through_bridge_qmb(rr: RR) -> None:
    req, resp = rr.k("q3.requests"), rr.k("q3.replies")
    await asyncio.to_thread(kafka_request, rr, req, "Q3-please",
                            {"mq.reply.topic": resp, "mq.correlation": "corr-k-1"})
    # MYQ3 (QALIAS on the bridge QMB, cluster DEMO) -> Q3 on QMC (cluster OTHER)
    _, msg_id, correl_id, _, reply_to = await replied_at(rr, QMC, "Q3", b"Q3-please")
    assert correl_id == msg_id
    assert reply_to == f"{REPLY_QUEUE}@{REPLY_QM_ALIAS}", "QMC answers via GWREPLY (QMB)"
    records = await asyncio.to_thread(kafka_console_records, rr, resp, 1, ARRIVE_S)
    assert len(records) == 1, f"no reply on {resp}\n{rr.net.log_tails()}"
    [rec] = records
    assert rec.value == ECHO_PREFIX.decode() + "Q3-please"
    assert rec.headers.get("mq.correlation") == "corr-k-1", rec.headers
    assert rec.key == "corr-k-1", "the reply record's key is the correlation data"
    assert "mq.error" not in rec.headers, rec.headers


@needs_mosquitto_clients
async def test_a_request_nobody_serves_gets_a_timeout_error_reply(rr: RR) -> None:
    req, resp = rr.t("idle/req/x"), rr.t("idle/resp/client1")
    sub = await mosquitto_sub(rr, resp)
    asked = time.monotonic()
    await asyncio.to_thread(mqtt_request, rr, req, "anyone?", resp, "corr-idle-1")
    got = await mqtt_lines(sub, 1, IDLE_TIMEOUT_S + ARRIVE_S,
                           "the timeout error reply of the SVC.IDLE route", rr)
    # not before the route's timeout (QUIET_S: mqtt_lines waited that long for a duplicate)
    assert time.monotonic() - asked >= IDLE_TIMEOUT_S + QUIET_S
    assert len(got) == 1, f"one error reply, no duplicate: {got}"
    topic, corr, payload = got[0].split("|", 2)
    assert (topic, corr) == (resp, "corr-idle-1")
    error = json.loads(payload)
    assert error["error"] == "timeout" and error["route"] == "mqtt-idle", error


@needs_mosquitto_clients
async def test_an_exception_report_from_qma_becomes_an_error_reply(rr: RR) -> None:
    """The request reaches QMA, which has no NO.SUCH.Q: QMA dead-letters it (2085) and,
    as the request asked (MQRO_EXCEPTION), sends an exception report to its ReplyToQ @
    ReplyToQMgr (MQGW.REPLY @ GWREPLY); the gateway turns it into the documented error
    reply long before the route's 120 s timeout."""
    req, resp = rr.t("noq/req/x"), rr.t("noq/resp/client1")
    sub = await mosquitto_sub(rr, resp)
    await asyncio.to_thread(mqtt_request, rr, req, "lost?", resp, "corr-noq-1")
    got = await mqtt_lines(sub, 1, ARRIVE_S, "the exception error reply of NO.SUCH.Q@QMA", rr)
    assert len(got) == 1, f"one error reply, no duplicate: {got}"
    topic, corr, payload = got[0].split("|", 2)
    assert (topic, corr) == (resp, "corr-noq-1")
    error = json.loads(payload)
    assert error["error"] == "exception", error
    assert error["feedback"] == Reason.UNKNOWN_OBJECT_NAME, error
    assert error["route"] == "mqtt-noq", error


# ---------------------------------------------------------------- the gateway as service -----


async def test_an_mq_application_calls_a_kafka_responder(rr: RR) -> None:
    target, replies = rr.k("pricing.requests"), rr.k("pricing.replies")
    async with kafka_responder(rr, target) as consumer:
        plain = await rr.net.put(GW_PRICING, request_md(), b"price IBM")
        own_correl = b"APP-CORREL-0000000000001"
        passed = await rr.net.put(GW_PRICING, request_md(
            correl_id=own_correl, report=Report.PASS_CORREL_ID), b"price HUR")
        for sent, body, answer in ((plain, b"price IBM", b"118.50"),
                                   (passed, b"price HUR", b"2.10")):
            rec = await next_record(consumer, f"the MQ request {body!r} on {target}")
            headers = dict(rec.headers)
            assert rec.value == body
            assert headers.get("mq.reply.topic") == replies.encode(), headers
            token = headers.get("mq.correlation")
            assert token == sent.msg_id, (token, sent.msg_id)
            await kafka_reply(rr, replies, answer, token)
    got = {}
    for _ in range(2):
        m = await rr.net.get(APP_REPLY, ARRIVE_S, "a reply of the Kafka responder")
        got[m.body] = m
    assert set(got) == {b"118.50", b"2.10"}
    # CorrelId per the request's report options; arrived at ReplyToQ @ TESTREPLY = TESTER
    assert got[b"118.50"].md.correl_id == plain.msg_id
    assert got[b"2.10"].md.correl_id == own_correl
    assert all(m.md.msg_type == MsgType.REPLY for m in got.values())
    assert await rr.net.drain(APP_REPLY, QUIET_S) == []


async def test_an_mq_application_calls_an_mqtt5_responder(rr: RR) -> None:
    target, replies = rr.t("weather/req"), rr.t("weather/rep")
    async with aiomqtt.Client(rr.mqtt.host, rr.mqtt.port, identifier=unique("rr-weather-"),
                              protocol=aiomqtt.ProtocolVersion.V5) as client:
        await client.subscribe(target, qos=1)
        sent = await rr.net.put(GW_WEATHER, request_md(), b"weather LHR")
        try:
            async with asyncio.timeout(ARRIVE_S):
                msg = await anext(aiter(client.messages))
        except TimeoutError:
            raise AssertionError(f"the MQ request on GW.WEATHER never reached {target} "
                                 f"within {ARRIVE_S:.0f} s\n{rr.net.log_tails()}") from None
        props = msg.properties
        assert props is not None, "the forwarded request has no MQTT 5 properties"
        assert msg.payload == b"weather LHR"
        assert props.ResponseTopic == replies  # type: ignore[attr-defined]
        token = bytes(props.CorrelationData)  # type: ignore[attr-defined]
        assert token == sent.msg_id
        out = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        out.CorrelationData = token
        await client.publish(replies, b"sunny", qos=1, properties=out)
    rep = await rr.net.get(APP_REPLY, ARRIVE_S, "the reply of the MQTT 5 responder")
    assert rep.body == b"sunny" and rep.md.correl_id == sent.msg_id
    assert rep.md.msg_type == MsgType.REPLY
    assert await rr.net.drain(APP_REPLY, QUIET_S) == []


# ---------------------------------------------------------------- tests that stop GW (last) -----


async def _stop_gw(rr: RR) -> None:
    code = await asyncio.to_thread(rr.net.stop, GW)
    assert code == 0, f"GW exit code {code}\n{rr.net.log_tail(GW)}"


async def test_an_unresolvable_reply_to_q_mgr_dead_letters_the_reply_on_gw(rr: RR) -> None:
    target, replies = rr.k("pricing.requests"), rr.k("pricing.replies")
    async with kafka_responder(rr, target) as consumer:
        sent = await rr.net.put(GW_PRICING, request_md(reply_to_q_mgr=UNKNOWN_QM),
                                b"price NOWHERE")
        rec = await next_record(consumer, "the request naming ReplyToQMgr NOWHERE.QM")
        while rec.value != b"price NOWHERE":  # the earlier test's records, if any
            rec = await next_record(consumer, "the request naming ReplyToQMgr NOWHERE.QM")
        await kafka_reply(rr, replies, b"lost", dict(rec.headers)["mq.correlation"])
    gw = rr.net.process(GW)
    deadline = time.monotonic() + ARRIVE_S
    while UNKNOWN_QM not in gw.log_since_start() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # the warning names the reply-to names (then it is done)
    await _stop_gw(rr)
    qm = EmbeddedQueueManager(GW, rr.net.root / GW / "qm")
    found = []
    try:
        async with await qm.connect() as conn:
            h = await conn.open(DLQ, OpenOption.INPUT_SHARED)
            while True:
                try:
                    m = await h.get(GetOptions())
                except MQError as exc:
                    assert exc.reason == Reason.NO_MSG_AVAILABLE
                    break
                found.append(unwrap_from_dlq(m.md, m.body))
    finally:
        await qm.close()
    await rr.net.restart(GW)
    mine = [(dlh, md, body) for dlh, md, body in found if dlh.dest_q_mgr_name == UNKNOWN_QM]
    assert len(mine) == 1, f"GW's DLQ: {[(d, b) for d, _, b in found]}\n{rr.net.log_tails()}"
    [(dlh, md, body)] = mine
    assert body == b"lost"
    assert dlh.reason == Reason.UNKNOWN_REMOTE_Q_MGR
    assert dlh.dest_q_name == APP_REPLY
    assert md.correl_id == sent.msg_id and md.msg_type == MsgType.REPLY
    assert await rr.net.drain(APP_REPLY, QUIET_S) == []


@needs_mosquitto_clients
async def test_correlation_survives_a_gateway_restart_between_request_and_reply(
    rr: RR,
) -> None:
    req, resp = rr.t("held/req/x"), rr.t("held/resp/client1")
    sub = await mosquitto_sub(rr, resp)
    await asyncio.to_thread(mqtt_request, rr, req, "hold me", resp, "corr-held-1")
    # the MQ service is this test, on TESTER's cluster queue SVC.HELD
    request = await rr.net.get(SVC_HELD, ARRIVE_S, "the gateway's request to SVC.HELD")
    assert request.body == b"hold me" and request.md.msg_type == MsgType.REQUEST
    assert (request.md.reply_to_q, request.md.reply_to_q_mgr) == (REPLY_QUEUE,
                                                                  REPLY_QM_ALIAS)
    await _stop_gw(rr)
    correl = (request.md.correl_id if request.md.report & Report.PASS_CORREL_ID
              else request.md.msg_id)
    await rr.net.put(request.md.reply_to_q, MQMD(
        format="MQSTR", msg_type=MsgType.REPLY, correl_id=correl,
        persistence=Persistence.PERSISTENT), b"released", q_mgr=request.md.reply_to_q_mgr)
    # GW is down: the reply waits on TESTER's cluster transmission queue
    assert rr.net.tester.qm.queue_depth("SYSTEM.CLUSTER.TRANSMIT.QUEUE") >= 1
    await rr.net.restart(GW)
    got = await mqtt_lines(sub, 1, ARRIVE_S, "the reply after GW's restart", rr)
    # exactly one reply (mqtt_lines waits QUIET_S for a duplicate), same correlation data
    assert got == [f"{resp}|corr-held-1|released"], got
