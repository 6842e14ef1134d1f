"""Issue 13's "Done when", first item: the seed's figure "A heterogeneous network" as three
processes over 127.0.0.1 channels (tests/support/legacy_network.py)::

    BROKERA (default, STOCK.STREAM, BULLETIN.STREAM)  <->  GW  <->  BROKERB (default,
                                                                    BULLETIN.STREAM,
                                                                    SPORTS.STREAM)

BROKERA and BROKERB are ``mqgw broker --profile legacy`` stand-ins, GW is ``mqgw run``
with its Kafka and MQTT plugins on the real brokers (session fixtures). Neighbours are
joined both ways (GW has A and B, A and B each have GW), every kind ``mqpubsub`` (MQRFH
commands, as a V6 broker speaks them); GW learns their streams from their StreamSupport
publications. Clients are outside the gateway: MQ applications on the TESTER queue
manager (MQRFH/MQRFH2 commands put over channels), Kafka's console consumer,
``mosquitto_pub``/``mosquitto_sub``. Operators' views are the documented commands
``mqgw neighbours list --json`` and ``mqgw subscriptions --json`` (both read only, fine
while the processes run) and GW's ``/metrics``.

One network for the module (starting it costs ~20 s); each test uses its own topics and
withdraws its subscriptions, and the redundant-path test, which restarts A and B with a
direct channel pair, runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.devstack import KafkaBroker, MosquittoBroker, console_tool_command
from gateway.devstack.ports import free_port
from gateway.mq.port import MQError
from gateway.runtime.cli import main as mqgw_main
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.legacy_network import (
    BROKERA,
    BROKERB,
    GW,
    TESTER,
    LegacyNetwork,
    channel_pair_mqsc,
    route_through_mqsc,
    start_legacy_network,
)
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, Received, decode, rfh2_message, rfh_message

pytestmark = [
    pytest.mark.slow,
    pytest.mark.kafka,
    pytest.mark.mqtt,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.mosquitto_clients,
]

STOCK, BULLETIN, SPORTS = "STOCK.STREAM", "BULLETIN.STREAM", "SPORTS.STREAM"
DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"
#: How long a "nothing more arrives" check waits for a late duplicate.
QUIET_S = 2.0
#: Proxy propagation / negotiation bound.
SETTLE_S = 30.0


# ---------------------------------------------------------------- the network -----


@dataclass
class SeedFigure:
    """The running network plus what the tests need to reach the plugins' far ends."""

    net: LegacyNetwork
    kafka: KafkaBroker
    mqtt: MosquittoBroker
    kafka_prefix: str  # GW's Kafka topics: <prefix>.<stream>
    mqtt_out: str  # GW publishes STOCK.STREAM to MQTT under <mqtt_out>/STOCK.STREAM/...
    mqtt_in: str  # MQTT <mqtt_in>/<topic> is published by GW on BULLETIN.STREAM <topic>
    metrics_port: int

    @property
    def root(self) -> Path:
        return self.net.root

    def gw_config(self) -> Path:
        return self.root / GW / "gateway.yaml"


def _plugins(kafka: KafkaBroker, mqtt: MosquittoBroker, prefix: str, out: str,
             inbound: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "kafka",
            "plugin": "kafka",
            "config": {
                "bootstrap_servers": kafka.bootstrap,
                "outbound": {
                    "topic_template": prefix + ".{stream}",
                    "routes": [{"stream": STOCK, "topic": "#"}],
                },
            },
        },
        {
            "name": "mqtt",
            "plugin": "mqtt",
            "config": {
                "host": mqtt.host,
                "port": mqtt.port,
                "client_id": unique("seed-gw-"),
                "outbound": {"prefix": out, "topics": [f"$SYS/STREAM/{STOCK}/#"]},
                "inbound": {
                    "filters": [
                        {"filter": f"{inbound}/#", "strip_prefix": f"{inbound}/",
                         "stream": BULLETIN},
                    ]
                },
            },
        },
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seed(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[SeedFigure]:
    root = tmp_path_factory.mktemp("seed")
    prefix, out, inbound = unique("seed."), unique("seed-out"), unique("seed-in")
    metrics_port = free_port()
    gateway_extra = {
        "metrics": {"enabled": True, "port": metrics_port},
        # GW between them: A its parent, B its child; streams learnt from StreamSupport.
        "neighbours": [
            {"q_mgr": BROKERA, "kind": "mqpubsub", "role": "parent", "probe_timeout": 2.0},
            {"q_mgr": BROKERB, "kind": "mqpubsub", "role": "child", "probe_timeout": 2.0},
        ],
    }
    net = await start_legacy_network(
        root,
        plugins=_plugins(kafka_broker, mqtt_broker, prefix, out, inbound),
        gateway_extra=gateway_extra,
        broker_args={
            BROKERA: ["--neighbour", f"{GW}:mqpubsub:child"],
            BROKERB: ["--neighbour", f"{GW}:mqpubsub:parent"],
        },
    )
    fig = SeedFigure(net, kafka_broker, mqtt_broker, prefix, out, inbound, metrics_port)
    try:
        await _wait_joined(fig)
        yield fig
    finally:
        await net.close()


async def _wait_joined(fig: SeedFigure) -> None:
    """Every link active both ways; each side learnt the other's streams (StreamSupport)."""

    def joined() -> bool:
        gw = {n["q_mgr"]: n for n in neighbours(fig, GW)}
        a, b = neighbours(fig, BROKERA), neighbours(fig, BROKERB)
        return (
            set(gw) == {BROKERA, BROKERB}
            and all(n["state"] == "active" for n in gw.values())
            and {STOCK, BULLETIN} <= set(gw[BROKERA]["common_streams"])
            and {BULLETIN, SPORTS} <= set(gw[BROKERB]["common_streams"])
            and [(n["q_mgr"], n["state"]) for n in a] == [(GW, "active")]
            and [(n["q_mgr"], n["state"]) for n in b] == [(GW, "active")]
            and BULLETIN in a[0]["common_streams"] and BULLETIN in b[0]["common_streams"]
        )

    await until(joined, SETTLE_S, fig, "the neighbours never all became active")
    gw = {n["q_mgr"]: n for n in neighbours(fig, GW)}
    # The seed: a broker only shares the streams both sides support.
    assert STOCK not in gw[BROKERB]["common_streams"], gw
    assert SPORTS not in gw[BROKERA]["common_streams"], gw
    # ... and each stand-in shares with GW only its own streams.
    [a] = neighbours(fig, BROKERA)
    [b] = neighbours(fig, BROKERB)
    assert SPORTS not in a["common_streams"] and STOCK not in b["common_streams"], (a, b)


# ---------------------------------------------------------------- operators' views -----


def mqgw(*argv: str) -> tuple[int, str]:
    """``mqgw ARGV`` in this process (the same code as the command line); (rc, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = mqgw_main(list(argv))
    return rc, buf.getvalue()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def neighbours(fig: SeedFigure, name: str) -> list[dict[str, Any]]:
    """``mqgw neighbours list --json`` of GW (by its config) or of a stand-in (data dir)."""
    where = (["--config", str(fig.gw_config())] if name == GW
             else ["--data-dir", str(fig.root / name)])
    rc, text = mqgw("neighbours", "list", "--json", *where)
    assert rc == 0, text
    return _json_lines(text)


def proxies_at(fig: SeedFigure, name: str, neighbour: str) -> int:
    """How many proxy subscriptions ``name`` has registered at ``neighbour``."""
    row = next((n for n in neighbours(fig, name) if n["q_mgr"] == neighbour), None)
    assert row is not None, f"{name} has no neighbour {neighbour}"
    return int(row["proxy_subscriptions"])


async def settled_proxies_at(fig: SeedFigure, name: str, neighbour: str) -> int:
    """:func:`proxies_at` once it stopped changing (two reads ``QUIET_S`` apart agree):
    the withdrawals of an earlier test may still be travelling."""
    deadline = time.monotonic() + SETTLE_S
    last = proxies_at(fig, name, neighbour)
    while time.monotonic() < deadline:
        await asyncio.sleep(QUIET_S)
        now = proxies_at(fig, name, neighbour)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the proxies of {name} at {neighbour} never settled")


def subscriptions(fig: SeedFigure, name: str) -> list[dict[str, Any]]:
    """``mqgw subscriptions --json`` of a broker's store (read only, while it runs)."""
    rc, text = mqgw("subscriptions", "--json", "--store", str(fig.root / name / "pubsub.db"))
    assert rc == 0, text
    return _json_lines(text)


def registered_by(fig: SeedFigure, at: str, q_mgr: str, stream: str,
                  prefix: str) -> list[str]:
    """Topics of the subscriptions at ``at`` that ``q_mgr`` registered (its proxies)
    on ``stream`` starting with ``prefix``."""
    return [
        s["topic"] for s in subscriptions(fig, at)
        if s["destination"].endswith(f"@{q_mgr}") and s["stream"] == stream
        and s["topic"].startswith(prefix)
    ]


def broker_messages(fig: SeedFigure) -> float:
    """GW's ``mqgw_broker_messages_total``: messages got from its serviced queues."""
    url = f"http://127.0.0.1:{fig.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("mqgw_broker_messages_total "):
            return float(line.split()[1])
    raise AssertionError(f"no mqgw_broker_messages_total in /metrics:\n{text[:2000]}")


async def until(predicate: Callable[[], bool], timeout: float, fig: SeedFigure,
                what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (within {timeout:.0f} s)\n{fig.net.log_tails()}")
        await asyncio.sleep(0.25)


# ---------------------------------------------------------------- MQ applications -----


async def command(fig: SeedFigure, at: str, queue: str, pairs: list[tuple[str, str]],
                  replies: str, payload: bytes = b"") -> Received:
    """An MQRFH request put at broker ``at`` (through TESTER); its response."""
    msg = rfh_message(queue, pairs, payload, reply_to_q=replies, reply_to_q_mgr=TESTER,
                      msg_type=MsgType.REQUEST)
    await fig.net.put(at, queue, msg.md, msg.body)
    got = await fig.net.get(replies, wait_s=20)
    return decode(got.md, got.body)


def comp_reason(r: Received) -> tuple[str | None, str | None]:
    return r.get("MQPSCompCode"), r.get("MQPSReason")


async def regsub(fig: SeedFigure, at: str, stream: str, topic: str, sub_q: str,
                 replies: str, *opts: str, register: bool = True) -> Received:
    pairs = [("MQPSCommand", "RegSub" if register else "DeregSub"),
             ("MQPSStreamName", stream), ("MQPSTopic", topic),
             ("MQPSQMgrName", TESTER), ("MQPSQName", sub_q)]
    pairs += [("MQPSRegOpts", o) for o in opts]
    return await command(fig, at, CONTROL, pairs, replies)


async def subscribed(fig: SeedFigure, at: str, stream: str, topic: str, sub_q: str,
                     replies: str, *opts: str) -> None:
    r = await regsub(fig, at, stream, topic, sub_q, replies, *opts)
    assert comp_reason(r) == ("0", "0"), (at, stream, topic, r.pairs)


async def unsubscribed(fig: SeedFigure, at: str, stream: str, topic: str, sub_q: str,
                       replies: str) -> None:
    r = await regsub(fig, at, stream, topic, sub_q, replies, register=False)
    assert comp_reason(r) == ("0", "0"), (at, stream, topic, r.pairs)


async def publish_rfh(fig: SeedFigure, at: str, stream: str, topic: str, payload: bytes,
                      *opts: str) -> None:
    pairs = [("MQPSCommand", "Publish"), ("MQPSStreamName", stream), ("MQPSTopic", topic)]
    pairs += [("MQPSPubOpts", o) for o in opts]
    msg = rfh_message(stream, pairs, payload, reply_to_q_mgr=TESTER)
    await fig.net.put(at, stream, msg.md, msg.body)


async def publish_rfh2(fig: SeedFigure, at: str, stream: str, topic: str,
                       payload: bytes) -> None:
    """An MQRFH2 publisher: ``psc`` folder, the stream in the topic (``$SYS/STREAM/``)."""
    msg = rfh2_message(stream, [("Command", "Publish"),
                                ("Topic", f"$SYS/STREAM/{stream}/{topic}")],
                       payload, reply_to_q_mgr=TESTER)
    await fig.net.put(at, stream, msg.md, msg.body)


async def publications(fig: SeedFigure, queue: str, count: int,
                       timeout: float = 30.0) -> list[Received]:
    """``count`` publications from TESTER's ``queue`` and whatever else arrives within
    QUIET_S after them (a duplicate would)."""
    out: list[Received] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            msg = await fig.net.get(queue, wait_s=min(left, 5.0))
        except MQError as exc:
            if exc.reason != Reason.NO_MSG_AVAILABLE:
                raise
            continue
        out.append(decode(msg.md, msg.body))
    out += [decode(m.md, m.body) for m in await fig.net.drain(queue, QUIET_S)]
    return out


def seen(got: list[Received]) -> list[tuple[str | None, bytes]]:
    return [(r.topic, r.payload) for r in got]


# ---------------------------------------------------------------- outside clients -----


def kafka_console_records(fig: SeedFigure, topic: str, count: int) -> list[str]:
    proc = subprocess.run(
        console_tool_command(
            "kafka-console-consumer",
            "--bootstrap-server", fig.kafka.bootstrap,
            "--topic", topic, "--from-beginning",
            "--max-messages", str(count), "--timeout-ms", "45000",
            "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|",
        ),
        capture_output=True, timeout=80, check=False,
    )
    return [ln for ln in proc.stdout.decode(errors="replace").splitlines() if ln]


def mosquitto_pub(fig: SeedFigure, topic: str, payload: str) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", fig.mqtt.host, "-p", str(fig.mqtt.port), "-V", "5",
         "-q", "1", "-t", topic, "-m", payload],
        check=True, timeout=30,
    )


async def mosquitto_sub(fig: SeedFigure, topic: str, count: int) -> asyncio.subprocess.Process:
    """``mosquitto_sub`` printing ``topic|payload`` of ``count`` messages, returned once
    it is subscribed (a probe publication came back)."""
    probe = unique("seed-probe/")
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", fig.mqtt.host, "-p", str(fig.mqtt.port), "-V", "5",
        "-q", "1", "-t", topic, "-t", probe, "-F", "%t|%p", "-C", str(count + 1),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        while True:
            await asyncio.to_thread(mosquitto_pub, fig, probe, "probe")
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(f"{probe}|".encode()), line
            return proc


async def mqtt_lines(proc: asyncio.subprocess.Process, count: int,
                     timeout: float) -> list[str]:
    assert proc.stdout is not None
    out: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while len(out) < count:
                line = await proc.stdout.readline()
                if not line:
                    break
                out.append(line.decode().rstrip("\n"))
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    return out


async def gather(*aws: Awaitable[Any]) -> list[Any]:
    return list(await asyncio.gather(*aws))


# ---------------------------------------------------------------- the checks -----


async def test_mqrfh2_publisher_at_b_reaches_an_mqrfh_subscriber_at_a_once(
    seed: SeedFigure,
) -> None:
    fig, net = seed, seed.net
    sub_q, replies = net.subscriber_queue("C1.SUB"), net.subscriber_queue("C1.REPLIES")
    await subscribed(fig, BROKERA, BULLETIN, "C1/*", sub_q, replies)
    # A's proxy at GW, GW's at B (interest crosses two hops).
    await until(lambda: registered_by(fig, GW, BROKERA, BULLETIN, "C1") != []
                and registered_by(fig, BROKERB, GW, BULLETIN, "C1") != [],
                SETTLE_S, fig, "the subscription at A never reached B as proxies")

    await publish_rfh2(fig, BROKERB, BULLETIN, "C1/news", b"from an RFH2 publisher at B")
    got = await publications(fig, sub_q, 1)
    assert [(r.fmt.strip(), r.topic, r.get("MQPSStreamName"), r.payload) for r in got] == [
        ("MQHRF", "C1/news", BULLETIN, b"from an RFH2 publisher at B")
    ], f"the MQRFH subscriber at A got {seen(got)} (expected exactly one)\n{net.log_tails()}"

    await unsubscribed(fig, BROKERA, BULLETIN, "C1/*", sub_q, replies)


async def test_a_stock_publication_at_a_reaches_kafka_and_mqtt_at_the_gateway(
    seed: SeedFigure,
) -> None:
    fig, net = seed, seed.net
    # The plugins' subscriptions at GW made GW register STOCK proxies at A (not at B).
    await until(lambda: registered_by(fig, BROKERA, GW, STOCK, "") != [],
                SETTLE_S, fig, "GW never registered its plugins' STOCK interest at A")
    assert registered_by(fig, BROKERB, GW, STOCK, "") == [], "STOCK is not B's stream"

    mqtt = await mosquitto_sub(fig, f"{fig.mqtt_out}/{STOCK}/C2/#", 1)
    await publish_rfh(fig, BROKERA, STOCK, "C2/IBM", b"IBM 119.00")
    mqtt_got = await mqtt_lines(mqtt, 1, 30)
    kafka_got = await asyncio.to_thread(kafka_console_records, fig, f"{fig.kafka_prefix}.{STOCK}",
                                        1)
    assert kafka_got == ["C2/IBM|IBM 119.00"], (
        f"Kafka console consumer of GW's topic got {kafka_got}\n{net.log_tails()}")
    assert mqtt_got == [f"{fig.mqtt_out}/{STOCK}/C2/IBM|IBM 119.00"], (
        f"mosquitto_sub got {mqtt_got}\n{net.log_tails()}")


async def test_an_mqtt_publish_at_the_gateway_reaches_a_and_b_once_each(
    seed: SeedFigure,
) -> None:
    fig, net = seed, seed.net
    qa, ra = net.subscriber_queue("C3.SUB.A"), net.subscriber_queue("C3.REPLIES.A")
    qb, rb = net.subscriber_queue("C3.SUB.B"), net.subscriber_queue("C3.REPLIES.B")
    await subscribed(fig, BROKERA, BULLETIN, "C3/*", qa, ra)
    await subscribed(fig, BROKERB, BULLETIN, "C3/*", qb, rb)
    await until(lambda: registered_by(fig, GW, BROKERA, BULLETIN, "C3") != []
                and registered_by(fig, GW, BROKERB, BULLETIN, "C3") != [],
                SETTLE_S, fig, "A's and B's proxies for C3 never reached GW")

    await asyncio.to_thread(mosquitto_pub, fig, f"{fig.mqtt_in}/C3/flash", "from MQTT")
    got_a, got_b = await gather(publications(fig, qa, 1), publications(fig, qb, 1))
    assert seen(got_a) == [("C3/flash", b"from MQTT")], (
        f"subscriber at A got {seen(got_a)}\n{net.log_tails()}")
    assert seen(got_b) == [("C3/flash", b"from MQTT")], (
        f"subscriber at B got {seen(got_b)}\n{net.log_tails()}")
    assert got_a[0].get("MQPSStreamName") == got_b[0].get("MQPSStreamName") == BULLETIN

    await unsubscribed(fig, BROKERA, BULLETIN, "C3/*", qa, ra)
    await unsubscribed(fig, BROKERB, BULLETIN, "C3/*", qb, rb)


async def test_sports_never_reaches_brokera_clients(seed: SeedFigure) -> None:
    fig, net = seed, seed.net
    replies = net.subscriber_queue("C4.REPLIES")
    qa, qgw = net.subscriber_queue("C4.SUB.A"), net.subscriber_queue("C4.SUB.GW")

    refused = await regsub(fig, BROKERA, SPORTS, "C4/*", qa, replies)
    assert comp_reason(refused) == ("2", "3071"), (
        f"A must refuse SPORTS.STREAM with MQRCCF_STREAM_ERROR: {refused.pairs}")

    # The same topic on BULLETIN at A, and a SPORTS subscriber at GW as the control
    # that the SPORTS publication does cross B -> GW.
    await subscribed(fig, BROKERA, BULLETIN, "C4/*", qa, replies)
    await subscribed(fig, GW, SPORTS, "C4/*", qgw, replies)
    await until(lambda: registered_by(fig, BROKERB, GW, SPORTS, "C4") != []
                and registered_by(fig, BROKERB, GW, BULLETIN, "C4") != [],
                SETTLE_S, fig, "GW never registered the C4 proxies at B")
    assert registered_by(fig, BROKERA, GW, SPORTS, "") == [], "SPORTS is not A's stream"

    await publish_rfh(fig, BROKERB, SPORTS, "C4/score", b"2-1")
    got_gw = await publications(fig, qgw, 1)
    assert seen(got_gw) == [("C4/score", b"2-1")], (
        f"control: the SPORTS subscriber at GW got {seen(got_gw)}\n{net.log_tails()}")
    got_a = await fig.net.drain(qa, QUIET_S)
    assert got_a == [], (
        f"SPORTS reached a client of A: {[decode(m.md, m.body).pairs for m in got_a]}")

    await unsubscribed(fig, BROKERA, BULLETIN, "C4/*", qa, replies)
    await unsubscribed(fig, GW, SPORTS, "C4/*", qgw, replies)


async def test_the_last_unsubscribe_withdraws_the_proxies_at_every_neighbour(
    seed: SeedFigure,
) -> None:
    fig, net = seed, seed.net
    q1, q2 = net.subscriber_queue("C5.SUB.1"), net.subscriber_queue("C5.SUB.2")
    replies = net.subscriber_queue("C5.REPLIES")
    before_gw_b = await settled_proxies_at(fig, GW, BROKERB)
    before_a_gw = await settled_proxies_at(fig, BROKERA, GW)

    # Two subscribers at A on one topic: one proxy per hop, counted twice.
    await subscribed(fig, BROKERA, BULLETIN, "C5/*", q1, replies)
    await subscribed(fig, BROKERA, BULLETIN, "C5/*", q2, replies)
    await until(lambda: registered_by(fig, BROKERB, GW, BULLETIN, "C5") != [],
                SETTLE_S, fig, "the C5 proxy never reached B")
    assert len(registered_by(fig, GW, BROKERA, BULLETIN, "C5")) == 1
    assert len(registered_by(fig, BROKERB, GW, BULLETIN, "C5")) == 1
    assert proxies_at(fig, GW, BROKERB) == before_gw_b + 1
    assert proxies_at(fig, BROKERA, GW) == before_a_gw + 1
    handled = broker_messages(fig)
    await publish_rfh(fig, BROKERB, BULLETIN, "C5/x", b"while subscribed")
    got = await gather(publications(fig, q1, 1), publications(fig, q2, 1))
    assert [seen(g) for g in got] == [[("C5/x", b"while subscribed")]] * 2, net.log_tails()
    # control: the counter below does see a publication B forwards to GW
    assert broker_messages(fig) > handled, "GW's /metrics did not count B's publication"

    # The first unsubscribe keeps the proxies (the other subscriber still wants them).
    await unsubscribed(fig, BROKERA, BULLETIN, "C5/*", q1, replies)
    await asyncio.sleep(QUIET_S)
    assert len(registered_by(fig, BROKERB, GW, BULLETIN, "C5")) == 1, (
        "the proxy at B went with the first of two subscribers")

    # The last one withdraws them at every neighbour: A's at GW, GW's at B.
    await unsubscribed(fig, BROKERA, BULLETIN, "C5/*", q2, replies)
    await until(lambda: registered_by(fig, GW, BROKERA, BULLETIN, "C5") == []
                and registered_by(fig, BROKERB, GW, BULLETIN, "C5") == [],
                SETTLE_S, fig, "the proxies were not withdrawn after the last DeregSub")
    await until(lambda: proxies_at(fig, GW, BROKERB) == before_gw_b
                and proxies_at(fig, BROKERA, GW) == before_a_gw,
                SETTLE_S, fig, "`mqgw neighbours list` still counts the C5 proxies")

    # A publication at B is no longer forwarded over B -> GW: GW gets nothing more.
    await asyncio.sleep(QUIET_S)
    handled = broker_messages(fig)
    await publish_rfh(fig, BROKERB, BULLETIN, "C5/x", b"after the last DeregSub")
    await asyncio.sleep(2 * QUIET_S)
    assert broker_messages(fig) == handled, (
        "GW still received a publication from B after the last unsubscribe at A")
    assert await net.drain(q1, 0.1) == [] and await net.drain(q2, 0.1) == []


async def test_a_delete_publication_at_a_removes_the_retained_publication_at_b(
    seed: SeedFigure,
) -> None:
    fig, net = seed, seed.net
    replies = net.subscriber_queue("C6.REPLIES")
    qa, qgw = net.subscriber_queue("C6.SUB.A"), net.subscriber_queue("C6.SUB.GW")
    qb = net.subscriber_queue("C6.SUB.B")
    poll_a = net.subscriber_queue("C6.POLL.A")

    await publish_rfh(fig, BROKERB, BULLETIN, "C6/headline", b"retained at B", "RetainPub")
    # A subscription at A: the proxies bring B's retained publication to GW and on to A.
    await subscribed(fig, BROKERA, BULLETIN, "C6/*", qa, replies)
    got = await publications(fig, qa, 1)
    assert seen(got) == [("C6/headline", b"retained at B")], (
        f"A's new subscriber got {seen(got)}\n{net.log_tails()}")
    # Held at GW and at A: each answers a new subscriber from its own copy.
    for at, q in ((GW, qgw), (BROKERA, poll_a)):
        await subscribed(fig, at, BULLETIN, "C6/*", q, replies, "PubOnReqOnly")
        r = await command(fig, at, CONTROL,
                          [("MQPSCommand", "ReqUpdate"), ("MQPSStreamName", BULLETIN),
                           ("MQPSTopic", "C6/*"), ("MQPSQMgrName", TESTER), ("MQPSQName", q)],
                          replies)
        assert comp_reason(r) == ("0", "0"), (at, r.pairs)
        held = await publications(fig, q, 1)
        assert seen(held) == [("C6/headline", b"retained at B")], (
            f"{at} does not hold the retained publication: {seen(held)}")
        await unsubscribed(fig, at, BULLETIN, "C6/*", q, replies)
    await unsubscribed(fig, BROKERA, BULLETIN, "C6/*", qa, replies)

    # Delete Publication at A: it propagates A -> GW -> B.
    delete = rfh_message(BULLETIN, [("MQPSCommand", "DeletePub"), ("MQPSStreamName", BULLETIN),
                                    ("MQPSTopic", "C6/headline")], reply_to_q_mgr=TESTER)
    await net.put(BROKERA, BULLETIN, delete.md, delete.body)

    async def retained_at_b() -> tuple[str | None, str | None]:
        r = await command(fig, BROKERB, CONTROL,
                          [("MQPSCommand", "ReqUpdate"), ("MQPSStreamName", BULLETIN),
                           ("MQPSTopic", "C6/*"), ("MQPSQMgrName", TESTER),
                           ("MQPSQName", qb)], replies)
        return comp_reason(r)

    r = await regsub(fig, BROKERB, BULLETIN, "C6/*", qb, replies, "PubOnReqOnly", "InformIfRet")
    assert r.get("MQPSCompCode") == "0", r.pairs
    deadline = time.monotonic() + SETTLE_S
    while (status := await retained_at_b()) == ("0", "0") and time.monotonic() < deadline:
        await net.drain(qb, 0.1)
        await asyncio.sleep(0.5)
    assert status == ("2", str(int(Reason.NO_RETAINED_MSG))), (
        f"Request Update at B after the DeletePub at A: {status} (expected 3075)\n"
        f"{net.log_tails()}")
    await unsubscribed(fig, BROKERB, BULLETIN, "C6/*", qb, replies)
    # A later RegSub at B with InformIfRet gets no retained publication either.
    await subscribed(fig, BROKERB, BULLETIN, "C6/*", qb, replies, "InformIfRet")
    left = await net.drain(qb, QUIET_S)
    assert left == [], f"B still delivered {[decode(m.md, m.body).pairs for m in left]}"
    await unsubscribed(fig, BROKERB, BULLETIN, "C6/*", qb, replies)


async def test_a_redundant_path_neither_loops_nor_duplicates(seed: SeedFigure) -> None:
    fig, net = seed, seed.net
    # A direct A <-> B channel pair (replacing the route through GW's queue manager).
    for me, other in ((BROKERA, BROKERB), (BROKERB, BROKERA)):
        assert net.stop(me) == 0, net.log_tail(me)
        path = fig.root / me / "channels.mqsc"
        text = path.read_text(encoding="utf-8").replace(
            route_through_mqsc(other, GW), f"DELETE QREMOTE({other})\n")
        text += channel_pair_mqsc(me, other, net.ports[other])
        path.write_text(text, encoding="utf-8")
    for me in (BROKERA, BROKERB):
        await net.restart(me)
    await until(lambda: all(n["state"] == "active" for n in neighbours(fig, GW)),
                SETTLE_S, fig, "GW's neighbours did not come back")

    rc, text = mqgw("neighbours", "join", BROKERB, "--kind", "mqpubsub",
                    "--probe-timeout", "5", "--data-dir", str(fig.root / BROKERA))
    assert rc == 0, text

    def decided() -> bool:
        row = next((n for n in neighbours(fig, BROKERA) if n["q_mgr"] == BROKERB), None)
        return row is not None and row["state"] in ("refused", "active")

    await until(decided, SETTLE_S, fig, "A's join of B was never decided")
    row = next(n for n in neighbours(fig, BROKERA) if n["q_mgr"] == BROKERB)
    assert (row["state"], row["refusal"]) == ("refused", f"loop: {BROKERB} is already "
                                              f"reachable through {GW}"), row
    await until(lambda: not [s for s in subscriptions(fig, BROKERB)
                             if s["destination"].endswith(f"@{BROKERA}")],
                SETTLE_S, fig, "A's probe subscription at B was not withdrawn")

    qb, replies = net.subscriber_queue("C7.SUB.B"), net.subscriber_queue("C7.REPLIES")
    await subscribed(fig, BROKERB, BULLETIN, "C7/*", qb, replies)
    await until(lambda: registered_by(fig, BROKERA, GW, BULLETIN, "C7") != [],
                SETTLE_S, fig, "B's subscription never reached A through GW")
    await publish_rfh(fig, BROKERA, BULLETIN, "C7/once", b"one path only")
    got = await publications(fig, qb, 1)
    assert seen(got) == [("C7/once", b"one path only")], (
        f"the subscriber at B got {seen(got)} (expected exactly once)\n{net.log_tails()}")
    await unsubscribed(fig, BROKERB, BULLETIN, "C7/*", qb, replies)
