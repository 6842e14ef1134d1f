"""Request/reply exchanges of the mqtt plugin (``Exchanges``) against the real Mosquitto,
driven by the external ``mosquitto_pub`` / ``mosquitto_sub`` clients: MQTT 5 reply
properties in and out, MQTT 3.1.1 without them, acknowledgement only after the handler,
refusals dead-lettered, idempotent ``consume``, and which side wins an overlap with the
publish/subscribe inbound filters; the gateway's origin marker on what it produces
(never taken back in, never forged through a forwarded publication); plus the batch
rules without a broker.

About 700 lines on purpose: every test shares the recording handler, the instance
fixture and the mosquitto_pub/mosquitto_sub helpers below.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import paho.mqtt.client as paho
import pytest

from gateway.devstack import MosquittoBroker
from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    Exchanges,
    PluginError,
    PublishRefusedError,
    Scheme,
)
from plugins.mqtt import MqttConfig, MqttInstance
from plugins.mqtt.connection import MqttConnection, Received
from plugins.mqtt.exchange import TOPIC_REFUSED, MqttExchanges, to_reply_outgoing
from tests.plugins.mqtt.mqtt_harness import (
    FixedPortMosquitto,
    client,
    collect,
    unique,
    user_props,
)

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.mosquitto_clients,
]


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[Envelope] = []

    async def publish(self, publications: Sequence[Envelope]) -> None:
        self.published.extend(publications)


class Context:
    def __init__(self, gateway_id: str = "gw-test") -> None:
        self.publisher = RecordingPublisher()
        self.gateway_id = gateway_id

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        return None

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        return False


class Handler:
    """Records every batch; ``fail`` decides, per call, what to raise (None: accept)."""

    def __init__(self, fail: Any = None) -> None:
        self.batches: list[list[Envelope]] = []
        self.fail = fail
        self.changed = asyncio.Event()

    @property
    def envelopes(self) -> list[Envelope]:
        return [e for b in self.batches for e in b]

    async def __call__(self, envelopes: Sequence[Envelope]) -> None:
        self.batches.append(list(envelopes))
        self.changed.set()
        if self.fail is not None:
            exc = self.fail(list(envelopes), len(self.batches))
            if exc is not None:
                raise exc

    async def wait_for(self, total: int, timeout: float = 20) -> None:
        async with asyncio.timeout(timeout):
            while len(self.envelopes) < total:
                self.changed.clear()
                await self.changed.wait()


def config(
    broker: MosquittoBroker | FixedPortMosquitto, protocol: str = "5", **inbound: Any
) -> MqttConfig:
    return MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "protocol": protocol,
            "client_id": unique("gw-rr-"),
            "outbound": {"topics": []},
            "inbound": {"filters": [], **inbound},
        }
    )


@contextlib.asynccontextmanager
async def started(
    cfg: MqttConfig, name: str = "m1", gateway_id: str = "gw-test"
) -> AsyncIterator[tuple[MqttInstance, Context]]:
    instance, context = MqttInstance(name, cfg), Context(gateway_id)
    await instance.start(context)
    try:
        yield instance, context
    finally:
        await instance.stop()


def mosquitto_pub(
    broker: MosquittoBroker | FixedPortMosquitto, topic: str, payload: str, *args: str
) -> None:
    version = "311" if "-V311" in args else "5"
    extra = [a for a in args if a != "-V311"]
    subprocess.run(
        ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-V", version,
         "-q", "1", "-t", topic, "-m", payload, *extra],
        check=True, timeout=30,
    )  # fmt: skip


async def mosquitto_sub(
    broker: MosquittoBroker, topic: str, fmt: str
) -> asyncio.subprocess.Process:
    """``mosquitto_sub -V 5 -F fmt`` on ``topic``, returned once subscribed (a probe
    publication came back)."""
    probe = unique("rr-probe/")
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-V", "5", "-q", "1",
        "-t", topic, "-t", probe, "-F", fmt,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        while True:
            await asyncio.to_thread(mosquitto_pub, broker, probe, "probe")
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(probe.encode()), line
            return proc


async def read_line(proc: asyncio.subprocess.Process, timeout: float = 20) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        return (await proc.stdout.readline()).decode().rstrip("\n")


async def no_more(handler: Handler, total: int, quiet: float = 1.5) -> None:
    await asyncio.sleep(quiet)
    assert len(handler.envelopes) == total


# ------------------------------------------------------------------- consume -----


async def test_mqtt5_request_carries_response_topic_correlation_data_and_properties(
    mqtt_broker: MosquittoBroker,
) -> None:
    base = unique("rr5")
    async with started(config(mqtt_broker)) as (instance, _):
        handler = Handler()
        await instance.consume("quote", [f"{base}/req/#"], handler)
        await asyncio.to_thread(
            mosquitto_pub, mqtt_broker, f"{base}/req/a", "hello",
            "-D", "publish", "response-topic", f"{base}/R",
            "-D", "publish", "correlation-data", "C-1",
            "-D", "publish", "user-property", "k", "v",
            "-D", "publish", "message-expiry-interval", "30",
        )  # fmt: skip
        await handler.wait_for(1)
    (env,) = handler.envelopes
    assert (env.stream, env.topic, env.payload) == ("", f"{base}/req/a", b"hello")
    assert env.reply_topic == f"{base}/R"
    assert env.correlation_data == b"C-1"
    assert dict(env.properties) == {"k": "v"}
    assert 290 <= env.expiry <= 300  # seconds x 10 (MQ tenths); the broker counts down
    assert env.persistent and env.origin == "m1"


async def test_mqtt311_request_has_no_reply_information(mqtt_broker: MosquittoBroker) -> None:
    base = unique("rr311")
    async with started(config(mqtt_broker, "3.1.1")) as (instance, _):
        handler = Handler()
        await instance.consume("quote", [f"{base}/req/#"], handler)
        # An MQTT 5 requester's properties never reach a 3.1.1 session.
        await asyncio.to_thread(
            mosquitto_pub, mqtt_broker, f"{base}/req/a", "hi",
            "-D", "publish", "response-topic", "R", "-D", "publish", "correlation-data", "C",
        )  # fmt: skip
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/b", "hi", "-V311")
        await handler.wait_for(2)
    for env in handler.envelopes:
        assert (env.reply_topic, env.correlation_data, dict(env.properties)) == ("", b"", {})
        assert env.expiry == -1


async def test_consume_twice_is_idempotent(mqtt_broker: MosquittoBroker) -> None:
    base = unique("rr-twice")
    async with started(config(mqtt_broker)) as (instance, _):
        first, second = Handler(), Handler()
        await instance.consume("quote", [f"{base}/req/#"], first)
        await instance.consume("quote", [f"{base}/req/#", f"{base}/other"], second)
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/a", "one")
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/other", "not a source")
        await first.wait_for(1)
        await no_more(first, 1)
        assert second.envelopes == []
        assert instance.stats()["exchange_handled"] == 1


def test_the_instance_implements_exchanges(mqtt_broker: MosquittoBroker) -> None:
    assert isinstance(MqttInstance("m1", config(mqtt_broker)), Exchanges)


async def test_consume_before_start_is_retriable(mqtt_broker: MosquittoBroker) -> None:
    instance = MqttInstance("m1", config(mqtt_broker))
    with pytest.raises(PluginError) as info:
        await instance.consume("quote", ["x/#"], Handler())
    assert info.value.retriable


async def test_exchange_source_wins_over_an_overlapping_inbound_filter(
    mqtt_broker: MosquittoBroker,
) -> None:
    base = unique("rr-overlap")
    cfg = config(mqtt_broker, filters=[{"filter": f"{base}/#"}])
    async with started(cfg) as (instance, context):
        handler = Handler()
        await instance.consume("quote", [f"{base}/req/#"], handler)
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/a", "request")
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/pub/b", "publication")
        await handler.wait_for(1)
        async with asyncio.timeout(20):
            while not context.publisher.published:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)
    # Mosquitto sends one copy per matching subscription (MQTT 5.0 §3.3.4 allows it):
    # every copy goes to the exchange, none into MQ; the copies carry the same reply
    # information, so the runtime's duplicate filter answers the request once.
    assert {e.topic for e in handler.envelopes} == {f"{base}/req/a"}
    assert 1 <= len(handler.envelopes) <= 2
    assert [p.payload for p in context.publisher.published] == [b"publication"]


# ------------------------------------------------------------ acknowledgement -----


async def test_retriable_handler_failure_is_not_acked_and_redelivered_after_reconnect(
    mqtt_broker: MosquittoBroker,
) -> None:
    base = unique("rr-retry")
    cfg = config(mqtt_broker)
    async with started(cfg) as (instance, _):
        failing = Handler(lambda envs, n: PluginError("MQ down", retriable=True))
        await instance.consume("quote", [f"{base}/req/#"], failing)
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/a", "again")
        async with asyncio.timeout(20):
            while len(failing.batches) < 2:  # retried after a backoff, same message
                failing.changed.clear()
                await failing.changed.wait()
        assert instance.stats()["exchange_handled"] == 0
    # No PUBACK was sent: the same persistent session gets it again. It arrives right
    # behind the CONNACK, before consume(): held for the route, not lost.
    async with started(cfg) as (instance, _):
        await asyncio.sleep(0.5)
        ok = Handler()
        await instance.consume("quote", [f"{base}/req/#"], ok)
        await ok.wait_for(1)
        assert ok.envelopes[0].payload == b"again"
    # Acknowledged this time: a third session gets nothing.
    async with started(cfg) as (instance, _):
        after = Handler()
        await instance.consume("quote", [f"{base}/req/#"], after)
        await no_more(after, 0)


async def test_refused_request_is_dead_lettered_and_acked(mqtt_broker: MosquittoBroker) -> None:
    base = unique("rr-refuse")
    dlq = unique("rr-dlq")
    cfg = config(mqtt_broker, dead_letter_topic=dlq)

    def refuse(envs: list[Envelope], n: int) -> Exception | None:
        for i, env in enumerate(envs):
            if env.payload == b"bad":
                return PublishRefusedError("cannot put", index=i, reason=2030)
        return None

    async with client(mqtt_broker.host, mqtt_broker.port) as watcher:
        await watcher.subscribe(f"{dlq}/#", qos=1)
        async with started(cfg) as (instance, _):
            handler = Handler(refuse)
            await instance.consume("quote", [f"{base}/req/#"], handler)
            await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/a", "bad")
            await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/b", "good")
            (parked,) = await collect(watcher, 1)
            async with asyncio.timeout(20):
                while instance.stats()["exchange_handled"] < 1:
                    await asyncio.sleep(0.05)
            assert instance.stats()["exchange_dead_lettered"] == 1
        assert str(parked.topic) == f"{dlq}/{base}/req/a"
        assert parked.payload == b"bad"
        assert ("mqgw-reason", "2030") in user_props(parked)
        assert ("mqgw-topic", f"{base}/req/a") in user_props(parked)
    # Both acknowledged: nothing comes back to the same session.
    async with started(cfg) as (instance, _):
        after = Handler()
        await instance.consume("quote", [f"{base}/req/#"], after)
        await no_more(after, 0)


# ------------------------------------------------------------------- produce -----


async def test_mqtt5_produce_sets_reply_properties(mqtt_broker: MosquittoBroker) -> None:
    base = unique("rr-out5")
    sub = await mosquitto_sub(mqtt_broker, f"{base}/#", "%t|%R|%D|%E|%P|%p")
    try:
        async with started(config(mqtt_broker)) as (instance, _):
            await instance.produce(
                [
                    Envelope(
                        stream="",
                        topic=f"{base}/reply",
                        payload=b"42",
                        properties={"mq.feedback": "0"},
                        expiry=600,
                        reply_topic=f"{base}/next",
                        correlation_data=b"C-7",
                    )
                ]
            )
            line = await read_line(sub)
    finally:
        sub.kill()
        await sub.wait()
    # A request forwarded to a responder: no origin marker (responders may copy it back).
    assert line == f"{base}/reply|{base}/next|C-7|60|mq.feedback:0|42"


async def test_mqtt5_replies_carry_the_gateways_origin(mqtt_broker: MosquittoBroker) -> None:
    """A reply (an envelope asking for no answer) carries user property mqgw-origin = the
    gateway id after its own properties; a property of that name from MQ is left out."""
    base = unique("rr-origin")
    sub = await mosquitto_sub(mqtt_broker, f"{base}/#", "%t|%D|%P|%p")
    try:
        async with started(config(mqtt_broker)) as (instance, _):
            await instance.produce(
                [
                    Envelope(
                        stream="",
                        topic=f"{base}/reply",
                        payload=b"119",
                        property_list=(("mq.msg.type", "reply"), ("mqgw-origin", "gw-other")),
                        correlation_data=b"C-8",
                    )
                ]
            )
            line = await read_line(sub)
    finally:
        sub.kill()
        await sub.wait()
    assert line == f"{base}/reply|C-8|mq.msg.type:reply mqgw-origin:gw-test|119"


async def test_mqtt311_produce_sends_the_payload_only(mqtt_broker: MosquittoBroker) -> None:
    base = unique("rr-out311")
    sub = await mosquitto_sub(mqtt_broker, f"{base}/#", "%t|%R|%D|%P|%p")
    try:
        async with started(config(mqtt_broker, "3.1.1")) as (instance, _):
            await instance.produce(
                [
                    Envelope(
                        stream="",
                        topic=f"{base}/reply",
                        payload=b'{"error": "timeout"}',
                        properties={"mq.error": "timeout"},
                        reply_topic="x",
                        correlation_data=b"C",
                    )
                ]
            )
            line = await read_line(sub)
    finally:
        sub.kill()
        await sub.wait()
    assert line == f'{base}/reply||||{{"error": "timeout"}}'


async def test_produce_refuses_a_topic_mqtt_cannot_publish_to(
    mqtt_broker: MosquittoBroker,
) -> None:
    async with started(config(mqtt_broker)) as (instance, _):
        good = Envelope(stream="", topic=unique("rr-ok/"), payload=b"x")
        bad = Envelope(stream="", topic="replies/+/x", payload=b"x")
        with pytest.raises(DeliveryRefusedError) as info:
            await instance.produce([good, bad])
    assert (info.value.index, info.value.reason) == (1, TOPIC_REFUSED)


async def test_produce_while_not_started_is_retriable(mqtt_broker: MosquittoBroker) -> None:
    instance = MqttInstance("m1", config(mqtt_broker))
    with pytest.raises(PluginError) as info:
        await instance.produce([Envelope(stream="", topic="t", payload=b"")])
    assert info.value.retriable


@pytest.mark.parametrize("topic", ["", "a/#", "a\0b"])
def test_reply_topic_names_mqtt_refuses(topic: str) -> None:
    from plugins.mqtt.mapping import MappingError

    with pytest.raises(MappingError):
        to_reply_outgoing(Envelope(stream="", topic=topic, payload=b""), v5=True, origin="gw")


# ------------------------------------------- the gateway's own messages (issue 29) -----


async def test_a_reply_never_comes_back_into_mq_through_an_inbound_filter(
    mqtt_broker: MosquittoBroker,
) -> None:
    """A requester named a topic an inbound filter of another instance of the same
    gateway matches: the reply carries the gateway's origin, so that instance skips it
    (acknowledged, counted) and publishes only the outsider's message into MQ."""
    base = unique("rr-own-in")
    async with (
        started(config(mqtt_broker), "m1") as (replier, _),
        started(config(mqtt_broker, filters=[{"filter": f"{base}/#"}]), "m2") as (inbound, ctx),
    ):
        await replier.produce(
            [Envelope(stream="", topic=f"{base}/reply", payload=b"a reply", correlation_data=b"C")]
        )
        await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/news", "outsider")
        async with asyncio.timeout(20):
            while not (
                b"outsider" in {p.payload for p in ctx.publisher.published}
                and (
                    inbound.stats().get("inbound_skipped_own")
                    or b"a reply" in {p.payload for p in ctx.publisher.published}
                )
            ):
                await asyncio.sleep(0.05)
        stats = inbound.stats()
    assert [p.payload for p in ctx.publisher.published] == [b"outsider"]
    assert stats["inbound_skipped_own"] == 1
    assert stats["inbound_dead_lettered"] == 0


async def test_an_exchange_source_refuses_the_gateways_own_messages(
    mqtt_broker: MosquittoBroker,
) -> None:
    """A requester named a request source of another instance of the same gateway as its
    reply topic: the reply is dead-lettered (reason 2035), never handled as a request."""
    base, dlq = unique("rr-own-src"), unique("rr-own-dlq")
    async with client(mqtt_broker.host, mqtt_broker.port) as watcher:
        await watcher.subscribe(f"{dlq}/#", qos=1)
        async with (
            started(config(mqtt_broker), "m1") as (replier, _),
            started(config(mqtt_broker, dead_letter_topic=dlq), "m2") as (service, _),
        ):
            handler = Handler()
            await service.consume("quote", [f"{base}/req/#"], handler)
            await replier.produce(
                [Envelope(stream="", topic=f"{base}/req/x", payload=b"a reply")]
            )
            await asyncio.to_thread(mosquitto_pub, mqtt_broker, f"{base}/req/y", "a request")
            (parked,) = await collect(watcher, 1)
            await handler.wait_for(1)
            await no_more(handler, 1)
            stats = service.stats()
    assert [e.payload for e in handler.envelopes] == [b"a request"]
    assert (str(parked.topic), parked.payload) == (f"{dlq}/{base}/req/x", b"a reply")
    assert ("mqgw-reason", "2035") in user_props(parked)
    assert ("mqgw-origin", "gw-test") in user_props(parked)  # a dead letter is the gateway's
    assert any(k == "mqgw-error" and "own origin" in v for k, v in user_props(parked))
    assert (stats["exchange_own_origin_refused"], stats["exchange_dead_lettered"]) == (1, 1)


async def test_a_forwarded_publication_cannot_carry_a_forged_origin(
    mqtt_broker: MosquittoBroker,
) -> None:
    """An MQ publisher names a usr property like the marker, with another gateway's id:
    the forwarded message carries no marker (mosquitto_sub sees the rest), so that
    gateway's inbound filter still publishes it into MQ."""
    base = unique("rr-forge")
    forwarding = MqttConfig.model_validate(
        {**config(mqtt_broker).model_dump(), "outbound": {"topics": ["#"], "prefix": base}}
    )
    sub = await mosquitto_sub(mqtt_broker, f"{base}/#", "%t|%P|%p")
    try:
        async with (
            started(forwarding, "m1", gateway_id="gw-a") as (outbound, _),
            started(
                config(mqtt_broker, filters=[{"filter": f"{base}/#"}]), "m1", gateway_id="gw-b"
            ) as (inbound, ctx),
        ):
            await outbound.send(
                [
                    Envelope(
                        stream="SYSTEM.BROKER.DEFAULT.STREAM",
                        topic="prices/IBM",
                        payload=b"119",
                        property_list=(("mqgw-origin", "gw-b"), ("colour", "blue")),
                    )
                ]
            )
            line = await read_line(sub)
            async with asyncio.timeout(20):
                while not ctx.publisher.published and not inbound.stats().get(
                    "inbound_skipped_own"
                ):
                    await asyncio.sleep(0.05)
    finally:
        sub.kill()
        await sub.wait()
    assert [(p.payload, dict(p.properties)) for p in ctx.publisher.published] == [
        (b"119", {"colour": "blue"})
    ]
    assert line == f"{base}/prices/IBM|colour:blue|119"


# ------------------------------------------------------------- subscriptions -----


async def wait_healthy(instance: MqttInstance, healthy: bool, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while instance.healthy() != healthy:
            await asyncio.sleep(0.05)


async def wait_acknowledged(instance: MqttInstance, handled: int) -> None:
    """Until ``handled`` messages are acknowledged and the broker has read the PUBACKs.

    A handler sees a message before its PUBACK goes out; a broker stopped in between
    keeps the message in the session and sends it again, as at-least-once allows. The
    broker reads a client's packets in order, so the PUBACK of a QoS 1 publication sent
    after the acks means it has read them."""
    async with asyncio.timeout(20):
        while instance.stats()["exchange_handled"] < handled:
            await asyncio.sleep(0.05)
    await instance.produce([Envelope(stream="", topic=unique("rr-sync/"), payload=b"")])


async def test_sources_are_resubscribed_after_a_lost_session_and_added_while_down(
    tmp_path: Path,
) -> None:
    broker = FixedPortMosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        cfg = config(broker).model_copy(
            update={"reconnect_min_delay": 0.1, "reconnect_max_delay": 0.5}
        )
        async with started(cfg) as (instance, _):
            first = Handler()
            await instance.consume("first", ["rr-a/#"], first)
            # The broker comes back without our session: every source is sent again.
            broker.stop()
            await wait_healthy(instance, False)
            (broker.work_dir / "mosquitto.db").unlink()
            broker.start()
            await wait_healthy(instance, True)
            await asyncio.to_thread(mosquitto_pub, broker, "rr-a/1", "after session loss")
            await first.wait_for(1)
            await wait_acknowledged(instance, 1)
            # A route added while the broker is down is subscribed on the next connection,
            # though the broker kept the session (and the older source).
            broker.stop()
            await wait_healthy(instance, False)
            second = Handler()
            await instance.consume("second", ["rr-b/#"], second)
            broker.start()
            await wait_healthy(instance, True)
            await asyncio.to_thread(mosquitto_pub, broker, "rr-b/1", "added while down")
            await asyncio.to_thread(mosquitto_pub, broker, "rr-a/2", "kept")
            await second.wait_for(1)
            await first.wait_for(2)
        assert [e.payload for e in first.envelopes] == [b"after session loss", b"kept"]
        assert [e.payload for e in second.envelopes] == [b"added while down"]
    finally:
        broker.stop()


# ------------------------------------------------- batch rules, without a broker -----


class FakeConnection:
    """What MqttExchanges uses of the connection: records acks and parked messages."""

    def __init__(self) -> None:
        self.generation = 1
        self.v5 = True
        self.acked: list[int] = []
        self.parked: list[str] = []

    async def subscribe_added(self) -> None:
        return None

    async def publish_all(self, outgoing: Sequence[Any], timeout: float) -> None:
        self.parked.extend(o.topic for o in outgoing)

    def ack(self, received: Received) -> bool:
        self.acked.append(received.message.mid)
        return True


def _received(mid: int, payload: bytes, generation: int = 1, qos: int = 1) -> Received:
    msg = paho.MQTTMessage(mid, b"req/a")
    msg.qos = qos
    msg.payload = payload
    return Received(msg, generation)


async def test_refusal_in_mid_batch_acks_before_parks_it_and_offers_the_rest_again() -> None:
    conn = FakeConnection()
    exchanges = MqttExchanges(
        cast(MqttConnection, conn), origin="m1", dead_letter_topic="dlq", ack_timeout=5
    )

    def refuse(envs: list[Envelope], n: int) -> Exception | None:
        payloads = [e.payload for e in envs]
        return (
            PublishRefusedError("no", index=payloads.index(b"bad")) if b"bad" in payloads else None
        )

    handler = Handler(refuse)
    await exchanges.consume("quote", ["req/#"], handler)
    for mid, payload in ((1, b"a"), (2, b"bad"), (3, b"c")):
        assert exchanges.offer(_received(mid, payload))
    assert not exchanges.offer(Received(paho.MQTTMessage(4, b"other"), 1))
    await handler.wait_for(4)
    await exchanges.stop()
    assert [[e.payload for e in b] for b in handler.batches] == [[b"a", b"bad", b"c"], [b"c"]]
    assert conn.acked == [1, 2, 3]
    assert conn.parked == ["dlq/req/a"]
    assert exchanges.counters.dead_lettered == 1


async def test_qos1_messages_of_a_lost_connection_are_left_for_redelivery() -> None:
    conn = FakeConnection()
    exchanges = MqttExchanges(
        cast(MqttConnection, conn), origin="m1", dead_letter_topic="dlq", ack_timeout=5
    )
    calls = 0

    def fail_once(envs: list[Envelope], n: int) -> Exception | None:
        nonlocal calls
        calls = n
        if n == 1:
            conn.generation = 2  # the link dropped while the handler ran
            return PluginError("MQ down", retriable=True)
        return None

    handler = Handler(fail_once)
    await exchanges.consume("quote", ["req/#"], handler)
    exchanges.offer(_received(1, b"q1", qos=1))
    exchanges.offer(_received(2, b"q2", qos=2))
    await handler.wait_for(2)
    async with asyncio.timeout(10):
        while calls < 2:
            handler.changed.clear()
            await handler.changed.wait()
    await asyncio.sleep(0.1)
    await exchanges.stop()
    # The QoS 1 copy comes again from the broker; the QoS 2 one (PUBREC sent) is retried.
    assert [e.payload for e in handler.batches[1]] == [b"q2"]
    assert conn.acked == [2]
    assert exchanges.counters.abandoned == 1


async def test_requests_without_correlation_data_get_an_identity_of_their_own() -> None:
    """Two equal MQTT 3.1.1 requests are two requests (distinct msg_id); one batch
    offered again after a handler failure keeps its identities (one MQ request each)."""
    conn = FakeConnection()
    conn.v5 = False
    exchanges = MqttExchanges(
        cast(MqttConnection, conn), origin="m1", dead_letter_topic="dlq", ack_timeout=5
    )
    handler = Handler(lambda envs, n: PluginError("MQ down", retriable=True) if n == 1 else None)
    await exchanges.consume("quote", ["req/#"], handler)
    exchanges.offer(_received(1, b"time?"))
    exchanges.offer(_received(2, b"time?"))
    await handler.wait_for(4)
    await exchanges.stop()
    first, again = handler.batches
    ids = [e.msg_id for e in first]
    assert len(set(ids)) == 2 and all(len(i) == 24 for i in ids)
    assert [e.msg_id for e in again] == ids
    assert conn.acked == [1, 2]
