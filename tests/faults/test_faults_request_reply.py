"""SIGKILL the gateway during request/reply traffic on issue 14's network
(tests/support/rr_network.py): no request or reply lost; duplicates only where
docs/request-reply.md's once/in-order table says at-least-once (issue 14, "Done when").

Four paths, each a numbered batch per trial, the requester checking every reply:

* ``MQTT->SVC.QUOTE``: MQTT 5 requests (Response Topic, Correlation Data) -> the echo
  application on QMA; the reply back through GW's reply-to alias.
* ``Kafka->MYQ3``: Kafka requests (``mq.reply.topic``, ``mq.correlation``) -> MYQ3 on the
  bridge QMB -> Q3 on QMC (cluster OTHER); reply back through QMB.
* ``MQ->GW.PRICING``: TESTER's requests answered by this test's Kafka responder.
* ``MQ->GW.WEATHER``: TESTER's requests answered by this test's MQTT 5 responder.

Each trial: (GW down) spawn ``mqgw run``, send the batch while it starts, SIGKILL it after
a random 0.2–2.0 s — counted from the spawn in a quarter of the trials, from its "started"
line in the rest — start it again and wait (bounded) until every request of the trial has
its reply; then SIGKILL it once more (quiet) so the next trial spawns it. Route timeouts
are 120 s, so a restart never turns into a "timeout" error reply: any error reply fails.

Every path of the table has an at-least-once window (a crash between the produce/put of a
reply and the correlation entry's finish), so a duplicate reply is allowed on every path
but must be identical to the first (same correlation data / CorrelId, same body). A
request may reach a service twice (echo applications: same MsgId, counted from their
``REPLIED`` log lines; the responders here: same token) — the requester still gets its
reply. The seed is printed; rerun one with ``MQGW_FAULT_SEED=<seed>``; the number of
trials is ``MQGW_RR_TRIALS`` (default 20, at least 20).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.gateway_process import ChildProcess
from tests.support.mq_app import ECHO_PREFIX
from tests.support.names import unique
from tests.support.rr_network import (
    APP_REPLY,
    GW,
    GW_PRICING,
    GW_WEATHER,
    MYQ3,
    QMA,
    QMC,
    SVC_QUOTE,
    TESTER_ALIAS,
    RRNetwork,
    start_rr_network,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.kafka, pytest.mark.mqtt]

TRIALS = max(20, int(os.environ.get("MQGW_RR_TRIALS", "20")))
#: Requests per path per trial.
PER_TRIAL = 4
KILL_AFTER = (0.2, 2.0)
#: Share of trials whose kill is timed from the spawn (during start-up).
STARTUP_KILLS = 0.25
#: Bound of the wait for a trial's replies after the restart.
REPLIES_S = 90.0
ROUTE_TIMEOUT_S = 120.0
STARTED = f"gateway {GW} started"
PATHS = ("MQTT->SVC.QUOTE", "Kafka->MYQ3", "MQ->GW.PRICING", "MQ->GW.WEATHER")
#: What the test's responders put before the request body.
PRICING_PREFIX, WEATHER_PREFIX = b"P:", b"W:"


@dataclass
class PathLedger:
    """One path: the requests sent and every reply the requester got, by request id."""

    sent: set[str] = field(default_factory=set)
    replies: dict[str, list[bytes]] = field(default_factory=dict)
    #: Replies that are wrong: error replies, unknown correlation, body mismatch.
    bad: list[str] = field(default_factory=list)
    #: Requests the service saw more than once (at-least-once into the service).
    service_duplicates: int = 0

    def reply(self, rid: str, body: bytes) -> None:
        self.replies.setdefault(rid, []).append(body)

    def lost(self) -> list[str]:
        return sorted(self.sent - set(self.replies))

    def duplicated(self) -> int:
        return sum(len(v) - 1 for v in self.replies.values())

    def unequal_duplicates(self) -> list[str]:
        return sorted(r for r, v in self.replies.items() if len(set(v)) > 1)


@dataclass
class World:
    net: RRNetwork
    kafka: KafkaBroker
    mqtt: MosquittoBroker
    base: str
    prefix: str
    ledger: dict[str, PathLedger] = field(
        default_factory=lambda: {p: PathLedger() for p in PATHS})
    #: MsgId of TESTER's requests -> (path, request id).
    mq_requests: dict[bytes, tuple[str, str]] = field(default_factory=dict)

    def t(self, suffix: str) -> str:
        return f"{self.base}/{suffix}"

    def k(self, suffix: str) -> str:
        return f"{self.prefix}.{suffix}"


def _config(kafka: KafkaBroker, mqtt: MosquittoBroker, base: str, prefix: str
            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    plugins = [
        {"name": "kafka", "plugin": "kafka", "config": {"bootstrap_servers": kafka.bootstrap}},
        {"name": "mqtt", "plugin": "mqtt",
         "config": {"host": mqtt.host, "port": mqtt.port, "client_id": unique("rrf-gw-"),
                    "protocol": "5"}},
    ]
    routes = {
        "requests": [
            {"name": "mqtt-quote", "plugin": "mqtt", "source": f"{base}/quote/req/#",
             "destination": SVC_QUOTE, "timeout": ROUTE_TIMEOUT_S},
            {"name": "kafka-q3", "plugin": "kafka", "source": f"{prefix}.q3.requests",
             "destination": MYQ3, "timeout": ROUTE_TIMEOUT_S},
        ],
        "services": [
            {"name": "pricing", "queue": GW_PRICING, "plugin": "kafka",
             "target": f"{prefix}.pricing.requests", "replies": f"{prefix}.pricing.replies",
             "timeout": ROUTE_TIMEOUT_S},
            {"name": "weather", "queue": GW_WEATHER, "plugin": "mqtt",
             "target": f"{base}/weather/req", "replies": f"{base}/weather/rep",
             "timeout": ROUTE_TIMEOUT_S},
        ],
    }
    return plugins, routes


def _is_error(body: bytes, properties: dict[str, str]) -> bool:
    return "mq.error" in properties or body.startswith(b'{"error"')


# ---------------------------------------------------------------- requesters -----


async def mqtt_requester_replies(w: World, client: aiomqtt.Client) -> None:
    """Record every reply on the MQTT response topic (correlation data = request id)."""
    led = w.ledger["MQTT->SVC.QUOTE"]
    async for msg in client.messages:
        props = msg.properties
        corr = bytes(getattr(props, "CorrelationData", b"") or b"")
        users = dict(getattr(props, "UserProperty", []) or [])
        body = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
        rid = corr.decode(errors="replace")
        if rid not in led.sent or _is_error(body, users) or body != ECHO_PREFIX + corr:
            led.bad.append(f"{msg.topic}: corr={corr!r} body={body[:200]!r} {users}")
        else:
            led.reply(rid, body)


async def send_mqtt_requests(w: World, client: aiomqtt.Client, ids: list[str]) -> None:
    led = w.ledger["MQTT->SVC.QUOTE"]
    for rid in ids:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = w.t("quote/resp/client")
        props.CorrelationData = rid.encode()
        await client.publish(w.t(f"quote/req/{rid}"), rid.encode(), qos=1, properties=props)
        led.sent.add(rid)  # PUBACKed: Mosquitto holds it for the gateway's session
        await asyncio.sleep(0.03)


async def kafka_requester_replies(w: World, consumer: AIOKafkaConsumer) -> None:
    led = w.ledger["Kafka->MYQ3"]
    async for rec in consumer:
        headers = {k: v for k, v in rec.headers}
        corr = headers.get("mq.correlation", b"")
        body = rec.value or b""
        text = {k: v.decode(errors="replace") for k, v in headers.items()}
        rid = corr.decode(errors="replace")
        if rid not in led.sent or _is_error(body, text) or body != ECHO_PREFIX + corr:
            led.bad.append(f"{rec.topic}: corr={corr!r} body={body[:200]!r} {text}")
        else:
            led.reply(rid, body)


async def send_kafka_requests(w: World, producer: AIOKafkaProducer, ids: list[str]) -> None:
    led = w.ledger["Kafka->MYQ3"]
    for rid in ids:
        await producer.send_and_wait(
            w.k("q3.requests"), rid.encode(),
            headers=[("mq.reply.topic", w.k("q3.replies").encode()),
                     ("mq.correlation", rid.encode())])
        led.sent.add(rid)  # acks=all: the gateway owes it a reply
        await asyncio.sleep(0.03)


async def send_mq_requests(w: World, path: str, queue: str, ids: list[str]) -> None:
    """TESTER puts requests (GW down or not: the cluster transmission queue holds them)."""
    led = w.ledger[path]
    for rid in ids:
        md = MQMD(format="MQSTR", msg_type=MsgType.REQUEST, reply_to_q=APP_REPLY,
                  reply_to_q_mgr=TESTER_ALIAS, persistence=Persistence.PERSISTENT)
        sent = await w.net.put(queue, md, rid.encode())
        w.mq_requests[sent.msg_id] = (path, rid)
        led.sent.add(rid)
        await asyncio.sleep(0.03)


async def mq_requester_replies(w: World, stop: asyncio.Event) -> None:
    """Read TESTER's APP.REPLY: CorrelId = the request's MsgId (default report options)."""
    prefixes = {"MQ->GW.PRICING": PRICING_PREFIX, "MQ->GW.WEATHER": WEATHER_PREFIX}
    async with await w.net.tester.qm.connect() as conn:
        h = await conn.open(APP_REPLY, OpenOption.INPUT_SHARED)
        while not stop.is_set():
            try:
                m = await h.get(GetOptions(wait_ms=300))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
                continue
            found = w.mq_requests.get(m.md.correl_id)
            if found is None:
                w.ledger["MQ->GW.PRICING"].bad.append(
                    f"{APP_REPLY}: unknown CorrelId {m.md.correl_id.hex()} {m.body[:200]!r}")
                continue
            path, rid = found
            if m.md.msg_type != MsgType.REPLY or m.body != prefixes[path] + rid.encode():
                w.ledger[path].bad.append(
                    f"{APP_REPLY}: {rid} type={m.md.msg_type} feedback={m.md.feedback} "
                    f"body={m.body[:200]!r}")
            else:
                w.ledger[path].reply(rid, m.body)


# ---------------------------------------------------------------- responders -----


async def kafka_responder(w: World, consumer: AIOKafkaConsumer,
                          producer: AIOKafkaProducer) -> None:
    """GW.PRICING's Kafka responder: reply ``P:<body>`` with the request's correlation."""
    seen: Counter[bytes] = Counter()
    async for rec in consumer:
        headers = dict(rec.headers)
        token = headers.get("mq.correlation", b"")
        seen[token] += 1
        if seen[token] == 2:
            w.ledger["MQ->GW.PRICING"].service_duplicates += 1
        await producer.send_and_wait(
            headers.get("mq.reply.topic", b"").decode(), PRICING_PREFIX + (rec.value or b""),
            headers=[("mq.correlation", token)])


async def mqtt_responder(w: World, client: aiomqtt.Client) -> None:
    """GW.WEATHER's MQTT 5 responder: reply ``W:<body>`` to the Response Topic."""
    seen: Counter[bytes] = Counter()
    async for msg in client.messages:
        props = msg.properties
        token = bytes(getattr(props, "CorrelationData", b"") or b"")
        seen[token] += 1
        if seen[token] == 2:
            w.ledger["MQ->GW.WEATHER"].service_duplicates += 1
        out = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        out.CorrelationData = token
        body = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
        await client.publish(str(getattr(props, "ResponseTopic", "")),
                             WEATHER_PREFIX + body, qos=1, properties=out)


# ---------------------------------------------------------------- the test -----


def echo_duplicates(proc: ChildProcess, queue: str) -> int:
    """Requests the echo application on ``queue`` answered more than once (same MsgId)."""
    msg_ids = Counter(line.split()[2] for line in proc.log_since_start().splitlines()
                      if line.split()[:2] == ["REPLIED", queue])
    return sum(n - 1 for n in msg_ids.values())


async def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05
                     ) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


def complete(w: World) -> bool:
    return all(not led.lost() for led in w.ledger.values())


def render(w: World, trials: int, **extra: Any) -> str:
    rows = [f"{'path':<18}{'requests':>9}{'lost':>6}{'dup replies':>12}"
            f"{'dup at service':>15}{'bad':>5}"]
    for name, led in w.ledger.items():
        rows.append(f"{name:<18}{len(led.sent):>9}{len(led.lost()):>6}"
                    f"{led.duplicated():>12}{led.service_duplicates:>15}{len(led.bad):>5}")
    return (f"request/reply SIGKILL: {trials} trials {json.dumps(extra)}\n"
            + "\n".join(rows))


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def test_sigkill_during_request_reply_loses_no_request_or_reply(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    seed = int(os.environ.get("MQGW_FAULT_SEED", str(random.randrange(1 << 30))))
    print(f"request/reply fault seed {seed} (rerun: MQGW_FAULT_SEED={seed})")
    rng = random.Random(seed)
    base, prefix = unique("rrf"), unique("rrf.")
    plugins, routes = _config(kafka_broker, mqtt_broker, base, prefix)
    started = time.monotonic()
    net = await start_rr_network(tmp_path, plugins=plugins, request_reply=routes)
    w = World(net, kafka_broker, mqtt_broker, base, prefix)
    gw = net.process(GW)
    tasks: list[asyncio.Task[Any]] = []
    stop = asyncio.Event()
    kafka = kafka_broker.bootstrap
    producer = AIOKafkaProducer(bootstrap_servers=kafka, acks="all")
    replies = AIOKafkaConsumer(w.k("q3.replies"), bootstrap_servers=kafka,
                               group_id=unique("rrf-req-"), auto_offset_reset="earliest")
    pricing = AIOKafkaConsumer(w.k("pricing.requests"), bootstrap_servers=kafka,
                               group_id=unique("rrf-pricing-"), auto_offset_reset="earliest")
    kills_while_running = after_start = 0
    try:
        await producer.start()
        await replies.start()
        await pricing.start()
        async with (
            aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, identifier=unique("rrf-req-"),
                           protocol=aiomqtt.ProtocolVersion.V5) as requester,
            aiomqtt.Client(mqtt_broker.host, mqtt_broker.port, identifier=unique("rrf-wx-"),
                           protocol=aiomqtt.ProtocolVersion.V5) as responder,
        ):
            await requester.subscribe(w.t("quote/resp/#"), qos=1)
            await responder.subscribe(w.t("weather/req"), qos=1)
            tasks = [asyncio.create_task(c) for c in (
                mqtt_requester_replies(w, requester), kafka_requester_replies(w, replies),
                mq_requester_replies(w, stop), kafka_responder(w, pricing, producer),
                mqtt_responder(w, responder))]
            gw.kill()  # each trial spawns it
            for t in range(TRIALS):
                ids = {p: [f"t{t}-{i}-{n}" for n in range(PER_TRIAL)]
                       for i, p in enumerate(PATHS)}
                gw.start()
                feeds: list[Awaitable[None]] = [
                    send_mqtt_requests(w, requester, ids["MQTT->SVC.QUOTE"]),
                    send_kafka_requests(w, producer, ids["Kafka->MYQ3"]),
                    send_mq_requests(w, "MQ->GW.PRICING", GW_PRICING, ids["MQ->GW.PRICING"]),
                    send_mq_requests(w, "MQ->GW.WEATHER", GW_WEATHER, ids["MQ->GW.WEATHER"]),
                ]
                fed = asyncio.gather(*feeds)
                if rng.random() >= STARTUP_KILLS:
                    await wait_until(lambda: gw.has_logged(STARTED) or not gw.running, 60)
                    after_start += 1
                await asyncio.sleep(rng.uniform(*KILL_AFTER))
                kills_while_running += gw.running
                gw.kill()
                async with asyncio.timeout(60):
                    await fed
                await net.restart(GW)
                if not await wait_until(lambda: complete(w), REPLIES_S, 0.1):
                    lost = {p: led.lost() for p, led in w.ledger.items() if led.lost()}
                    raise AssertionError(f"trial {t} (seed {seed}): no reply within "
                                         f"{REPLIES_S:.0f} s to {lost}\n{render(w, t + 1)}\n"
                                         f"{net.log_tails()}")
                gw.kill()
            # the last trial's late duplicates (if any) arrive on a running gateway
            await net.restart(GW)
            await asyncio.sleep(3.0)
            stop.set()
            await _cancel(tasks)
    finally:
        stop.set()
        await _cancel(tasks)
        for client in (producer, replies, pricing):
            with contextlib.suppress(Exception):
                await client.stop()
        await net.close()
    w.ledger["MQTT->SVC.QUOTE"].service_duplicates = echo_duplicates(net.nodes[QMA], SVC_QUOTE)
    w.ledger["Kafka->MYQ3"].service_duplicates = echo_duplicates(net.nodes[QMC], "Q3")
    table = render(w, TRIALS, seed=seed, killed_while_running=kills_while_running,
                   kills_timed_from_started_line=after_start,
                   seconds=round(time.monotonic() - started, 1))
    print(table)
    (tmp_path / "fault-request-reply.txt").write_text(table + "\n", encoding="utf-8")
    for name, led in w.ledger.items():
        assert not led.lost(), f"{name}: requests without a reply {led.lost()}\n{table}"
        assert not led.bad, f"{name}: wrong or error replies {led.bad[:10]}\n{table}"
        # at-least-once (every path of the table): a duplicate is the same reply again
        assert not led.unequal_duplicates(), f"{name}: {led.unequal_duplicates()}\n{table}"
    assert kills_while_running >= TRIALS // 2, table
