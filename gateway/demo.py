"""``make demo``: the whole slice on one machine, with live progress and a summary.

Starts a local Kafka broker and Mosquitto (the devstack), an embedded queue manager with
the seed's streams (SYSTEM.BROKER.DEFAULT.STREAM, STOCK.STREAM, BULLETIN.STREAM) and the
gateway with its Kafka and MQTT plugins, then plays legacy MQ applications against it:

* an MQRFH publisher of ``IBM/Latest`` on STOCK.STREAM naming the stream explicitly
  (``MQPSStreamName``), and an MQRFH2 publisher using the ``$SYS/STREAM/BULLETIN.STREAM/``
  topic prefix;
* an MQRFH subscriber and an MQRFH2 subscriber of STOCK.STREAM;
* a Kafka consumer and an MQTT subscriber watching what the gateway bridges out;
* a Kafka producer and an MQTT publisher sending back into MQ.

It ends with a table (sent / received per path, latency percentiles) and exits 0 only
when every path delivered everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.mq.port import Connection, GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2

log = logging.getLogger("gateway.demo")

STOCK = "STOCK.STREAM"
BULLETIN = "BULLETIN.STREAM"
RFH_SUB_Q = "DEMO.RFH.SUBSCRIBER"
RFH2_SUB_Q = "DEMO.RFH2.SUBSCRIBER"
KAFKA_IN = "demo.to-mq"
MQTT_IN = "demo/to-mq"

PATHS = (
    "MQRFH publisher -> Kafka",
    "MQRFH2 publisher -> Kafka",
    "MQRFH publisher -> MQTT",
    "MQRFH2 publisher -> MQTT",
    "Kafka -> MQRFH subscriber",
    "Kafka -> MQRFH2 subscriber",
    "MQTT -> MQRFH subscriber",
    "MQTT -> MQRFH2 subscriber",
)


#: The first record/message each modern client saw, shown to the user.
SAMPLES: dict[str, str] = {}


@dataclass
class PathStats:
    sent: int = 0
    received: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, sent_at: float) -> None:
        self.received += 1
        self.latencies.append(max(0.0, time.time() - sent_at))


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _body(path_id: str, seq: int) -> bytes:
    return json.dumps({"path": path_id, "seq": seq, "sent": time.time()}).encode()


def _parse(payload: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and "path" in data else None


# ----------------------------------------------------------------- legacy MQ apps ----


def _rfh_command(pairs: list[tuple[str, str]], payload: bytes = b"") -> tuple[MQMD, bytes]:
    rfh = MQRFH(name_values=pairs, format=FMT_STRING if payload else "", coded_char_set_id=1208)
    md = MQMD(
        format=FMT_RF_HEADER, msg_type=MsgType.DATAGRAM, persistence=1, coded_char_set_id=1208
    )
    return md, encode_rfh(rfh, ccsid=1208) + payload


def _rfh2_command(
    psc: list[tuple[str, str]], payload: bytes = b"", usr: dict[str, str] | None = None
) -> tuple[MQMD, bytes]:
    folders = [Element.from_pairs("psc", psc)]
    if usr:
        folders.append(Element.from_pairs("usr", usr))
    rfh2 = MQRFH2(folders=folders, format=FMT_STRING if payload else "", coded_char_set_id=1208)
    md = MQMD(
        format=FMT_RF_HEADER_2, msg_type=MsgType.DATAGRAM, persistence=1, coded_char_set_id=1208
    )
    return md, encode_rfh2(rfh2, ccsid=1208) + payload


async def register_subscribers(conn: Connection) -> None:
    md, body = _rfh_command(
        [
            ("MQPSCommand", "RegSub"),
            ("MQPSStreamName", STOCK),
            ("MQPSTopic", "*"),
            ("MQPSQName", RFH_SUB_Q),
        ]
    )
    await conn.put1(CONTROL_QUEUE, md, body, PutOptions())
    md, body = _rfh2_command(
        [("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{STOCK}/#"), ("QName", RFH2_SUB_Q)]
    )
    await conn.put1(CONTROL_QUEUE, md, body, PutOptions())


async def publish_legacy(conn: Connection, count: int, stats: dict[str, PathStats]) -> None:
    """The MQRFH and MQRFH2 publishers, interleaved, one message each per step."""
    for seq in range(count):
        md, body = _rfh_command(
            [
                ("MQPSCommand", "Publish"),
                ("MQPSStreamName", STOCK),
                ("MQPSTopic", "IBM/Latest"),
            ],
            _body("rfh", seq),
        )
        await conn.put1(STOCK, md, body, PutOptions())
        md, body = _rfh2_command(
            [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{BULLETIN}/News/Markets")],
            _body("rfh2", seq),
            usr={"Desk": "London"},
        )
        await conn.put1("SYSTEM.BROKER.DEFAULT.STREAM", md, body, PutOptions())
        for name in PATHS[:4]:
            stats[name].sent += 1
        await asyncio.sleep(0.005)


async def read_subscribers(
    conn: Connection, stats: dict[str, PathStats], stop: asyncio.Event
) -> None:
    handles = {
        RFH_SUB_Q: await conn.open(RFH_SUB_Q, OpenOption.INPUT_SHARED),
        RFH2_SUB_Q: await conn.open(RFH2_SUB_Q, OpenOption.INPUT_SHARED),
    }
    while not stop.is_set():
        got_any = False
        for queue, handle in handles.items():
            try:
                m = await handle.get(GetOptions(wait_ms=0))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    continue
                raise
            got_any = True
            if m.md.format == FMT_RF_HEADER:
                _, used = decode_rfh(m.body, m.md.encoding, ccsid=m.md.coded_char_set_id)
            else:
                _, used = decode_rfh2(m.body, m.md.encoding, ccsid=m.md.coded_char_set_id)
            data = _parse(m.body[used:])
            if data is None or data["path"] not in ("kafka", "mqtt"):
                continue
            source = "Kafka" if data["path"] == "kafka" else "MQTT"
            kind = "MQRFH" if queue == RFH_SUB_Q else "MQRFH2"
            stats[f"{source} -> {kind} subscriber"].add(float(data["sent"]))
        if not got_any:
            await asyncio.sleep(0.02)


# ----------------------------------------------------------------- modern clients ----


async def kafka_consumer(
    bootstrap: str, stats: dict[str, PathStats], ready: asyncio.Event, stop: asyncio.Event
) -> None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        f"mqgw.{STOCK}",
        f"mqgw.{BULLETIN}",
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id="mqgw-demo-viewer",
        metadata_max_age_ms=1000,
    )
    await consumer.start()
    ready.set()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    data = _parse(r.value or b"")
                    if data is None:
                        continue
                    if "kafka" not in SAMPLES and data["path"] == "rfh2":
                        heads = {k: v for k, v in r.headers if not k.startswith("mq.msgId")}
                        SAMPLES["kafka"] = f"topic={r.topic} key={r.key!r} headers=" + ", ".join(
                            f"{k}={v.decode(errors='replace')}"
                            for k, v in heads.items()
                            if k in ("mq.stream", "mq.topic", "mq.pubHeader", "usr.Desk")
                        )
                    if data["path"] == "rfh":
                        stats["MQRFH publisher -> Kafka"].add(float(data["sent"]))
                    elif data["path"] == "rfh2":
                        stats["MQRFH2 publisher -> Kafka"].add(float(data["sent"]))
    finally:
        await consumer.stop()


async def kafka_producer(bootstrap: str, count: int, stats: dict[str, PathStats]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for seq in range(count):
            await producer.send_and_wait(KAFKA_IN, _body("kafka", seq), key=b"FromKafka/Quote")
            stats["Kafka -> MQRFH subscriber"].sent += 1
            stats["Kafka -> MQRFH2 subscriber"].sent += 1
    finally:
        await producer.stop()


async def mqtt_subscriber(
    host: str, port: int, stats: dict[str, PathStats], ready: asyncio.Event, stop: asyncio.Event
) -> None:
    import aiomqtt

    async with aiomqtt.Client(
        host, port, identifier="mqgw-demo-viewer", protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        await client.subscribe("mq/#", qos=1)
        ready.set()
        messages = client.messages
        while not stop.is_set():
            try:
                async with asyncio.timeout(0.2):
                    msg = await anext(messages)
            except TimeoutError:
                continue
            payload = msg.payload if isinstance(msg.payload, bytes) else str(msg.payload).encode()
            data = _parse(payload)
            if data is None:
                continue
            if "mqtt" not in SAMPLES and data["path"] == "rfh2":
                props = getattr(msg.properties, "UserProperty", None) if msg.properties else None
                SAMPLES["mqtt"] = f"topic={msg.topic} qos={msg.qos} user_properties={props}"
            if data["path"] == "rfh":
                stats["MQRFH publisher -> MQTT"].add(float(data["sent"]))
            elif data["path"] == "rfh2":
                stats["MQRFH2 publisher -> MQTT"].add(float(data["sent"]))


async def mqtt_publisher(host: str, port: int, count: int, stats: dict[str, PathStats]) -> None:
    import aiomqtt

    async with aiomqtt.Client(host, port, identifier="mqgw-demo-sender") as client:
        for seq in range(count):
            await client.publish(f"{MQTT_IN}/FromMqtt/Quote", _body("mqtt", seq), qos=1)
            stats["MQTT -> MQRFH subscriber"].sent += 1
            stats["MQTT -> MQRFH2 subscriber"].sent += 1


# ----------------------------------------------------------------- orchestration -----


def gateway_config(work: Path, bootstrap: str, mqtt_host: str, mqtt_port: int) -> dict[str, Any]:
    (work / "demo.mqsc").write_text(
        f"DEFINE QLOCAL({RFH_SUB_Q}) REPLACE\nDEFINE QLOCAL({RFH2_SUB_Q}) REPLACE\n"
    )
    return {
        "id": "mqgw-demo",
        "queue_manager": {"name": "QM1", "data_dir": "qm", "mqsc_file": "demo.mqsc"},
        "broker": {
            "store": "pubsub.db",
            "streams": [{"name": STOCK}, {"name": BULLETIN}],
            "wait_ms": 100,
        },
        "metrics": {"enabled": True, "port": 0},
        "logging": {"format": "text", "level": "warning"},
        "plugins": [
            {
                "name": "kafka",
                "plugin": "kafka",
                "config": {
                    "bootstrap_servers": bootstrap,
                    "outbound": {
                        "routes": [
                            {"stream": STOCK, "topic": "#"},
                            {"stream": BULLETIN, "topic": "#"},
                        ]
                    },
                    "inbound": {"topics": [{"kafka_topic": KAFKA_IN, "stream": STOCK}]},
                },
            },
            {
                "name": "mqtt",
                "plugin": "mqtt",
                "config": {
                    "host": mqtt_host,
                    "port": mqtt_port,
                    "outbound": {
                        "prefix": "mq",
                        "topics": [f"$SYS/STREAM/{STOCK}/#", f"$SYS/STREAM/{BULLETIN}/#"],
                    },
                    "inbound": {
                        "filters": [
                            {
                                "filter": f"{MQTT_IN}/#",
                                "strip_prefix": f"{MQTT_IN}/",
                                "stream": STOCK,
                            }
                        ]
                    },
                },
            },
        ],
    }


_SHORT = {
    "MQRFH publisher -> Kafka": "RFH>K",
    "MQRFH2 publisher -> Kafka": "RFH2>K",
    "MQRFH publisher -> MQTT": "RFH>M",
    "MQRFH2 publisher -> MQTT": "RFH2>M",
    "Kafka -> MQRFH subscriber": "K>RFH",
    "Kafka -> MQRFH2 subscriber": "K>RFH2",
    "MQTT -> MQRFH subscriber": "M>RFH",
    "MQTT -> MQRFH2 subscriber": "M>RFH2",
}


def _progress(stats: dict[str, PathStats], final: bool = False) -> None:
    parts = [f"{_SHORT[name]} {s.received}/{s.sent}" for name, s in stats.items()]
    sys.stdout.write("  " + "  ".join(parts) + ("\n" if final else "\r"))
    sys.stdout.flush()


def summary(stats: dict[str, PathStats]) -> str:
    header = f"{'path':<28} {'sent':>6} {'received':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    lines = [header, "-" * len(header)]
    for name, s in stats.items():
        p = [percentile(s.latencies, q) * 1000 for q in (50, 95, 99)]
        lines.append(
            f"{name:<28} {s.sent:>6} {s.received:>9} {p[0]:>8.1f} {p[1]:>8.1f} {p[2]:>8.1f}"
        )
    return "\n".join(lines)


async def exercise(
    bootstrap: str, mqtt_host: str, mqtt_port: int, count: int, timeout: float, work: Path
) -> dict[str, PathStats]:
    """Run the gateway against running brokers and drive every path; the statistics."""
    stats = {name: PathStats() for name in PATHS}
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(
        gateway_config(work, bootstrap, mqtt_host, mqtt_port), registry, base_dir=work
    )
    app = GatewayApp(loaded, registry)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    await app.start()
    try:
        async with asyncio.timeout(60):
            while not app.health()[0]:
                await asyncio.sleep(0.1)
        port = app.http.port if app.http else 0
        print(f"  gateway up: embedded QM1, streams {STOCK} and {BULLETIN}; metrics :{port}")
        assert app.qm is not None
        conn = await app.qm.connect()
        reader = await app.qm.connect()
        await register_subscribers(conn)
        kafka_ready, mqtt_ready = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(kafka_consumer(bootstrap, stats, kafka_ready, stop)),
            asyncio.create_task(mqtt_subscriber(mqtt_host, mqtt_port, stats, mqtt_ready, stop)),
            asyncio.create_task(read_subscribers(reader, stats, stop)),
        ]
        async with asyncio.timeout(60):
            await kafka_ready.wait()
            await mqtt_ready.wait()
        await asyncio.sleep(1.0)  # subscriptions registered, consumers assigned
        print(f"  sending {count} messages on each path ...")
        await publish_legacy(conn, count, stats)
        await kafka_producer(bootstrap, count, stats)
        await mqtt_publisher(mqtt_host, mqtt_port, count, stats)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _progress(stats)
            if all(s.received >= s.sent for s in stats.values()):
                break
            await asyncio.sleep(0.25)
        _progress(stats, final=True)
        await conn.disconnect()
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(t, 5)
        await app.shutdown()
    return stats


def report(stats: dict[str, PathStats]) -> bool:
    """Print the samples and the summary table; True when every path delivered all."""
    print()
    for who, text in sorted(SAMPLES.items()):
        print(f"  a {who} consumer received: {text}")
    print()
    print(summary(stats))
    ok = all(s.sent > 0 and s.received == s.sent for s in stats.values())
    print()
    print("demo: every path delivered everything" if ok else "demo: some paths fell short")
    return ok


async def run_demo(count: int, timeout: float, work: Path) -> int:
    from gateway.devstack.kafka import KafkaBroker
    from gateway.devstack.mosquitto import MosquittoBroker

    print("mqgw demo: starting Mosquitto and Kafka (first run downloads Kafka's jars) ...")
    mqtt = MosquittoBroker(work / "mosquitto")
    kafka = KafkaBroker(work / "kafka")
    try:
        await asyncio.to_thread(mqtt.start)
        await asyncio.to_thread(kafka.start)
        print(f"  Mosquitto on {mqtt.host}:{mqtt.port}, Kafka on {kafka.bootstrap}")
        stats = await exercise(kafka.bootstrap, mqtt.host, mqtt.port, count, timeout, work)
    finally:
        await asyncio.to_thread(kafka.stop)
        await asyncio.to_thread(mqtt.stop)
    return 0 if report(stats) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--count", type=int, default=200, help="messages per path")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for delivery")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # aiokafka logs start-up races (topic not created yet) at ERROR; they resolve alone.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    work = Path(tempfile.mkdtemp(prefix="mqgw-demo-"))
    try:
        return asyncio.run(run_demo(args.count, args.timeout, work))
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
