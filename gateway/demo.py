"""``make demo``: the whole slice on one machine, with live progress and a summary.

Starts a local Kafka broker and Mosquitto (the devstack), an embedded queue manager with
the seed's streams (SYSTEM.BROKER.DEFAULT.STREAM, STOCK.STREAM, BULLETIN.STREAM) and the
gateway with its Kafka and MQTT plugins, then plays legacy MQ applications against it:

* an MQRFH tick feed publishing ``IBM/Latest`` and ``HPQ/Latest`` on STOCK.STREAM, naming
  the stream explicitly (``MQPSStreamName``), ticks ``SYMBOL PRICE VOLUME``; and an
  MQRFH2 publisher using the ``$SYS/STREAM/BULLETIN.STREAM/`` topic prefix;
* an MQRFH subscriber and an MQRFH2 subscriber of STOCK.STREAM;
* a Kafka consumer and an MQTT subscriber watching what the gateway bridges out;
* a Kafka producer and an MQTT publisher sending back into MQ;
* the analytics loop: once the ticks are in Kafka, ``mqgw analytics ohlc --once`` (Spark,
  a separate process) turns them into 1-minute bars on ``mqgw-analytics.ohlc``; the
  gateway's Kafka inbound publishes the bars on STOCK.STREAM as ``OHLC/1m/<SYMBOL>`` and
  an MQRFH subscriber (``OHLC/1m/*``, character wildcards) and an MQRFH2 subscriber
  (``$SYS/STREAM/STOCK.STREAM/OHLC/1m/+``, topic wildcards) receive them, checked against
  bars computed here from the ticks sent.

The ohlc job buckets ticks by MQMD PutDate/PutTime (``mq.putTime``). So that a short run
spans two one-minute windows, the tick feed stamps its own put times over the two whole
minutes before the run (MQPMO_SET_ALL_CONTEXT, as a feed handler replaying exchange
times does); docs/demo.md says so. It ends with a table (sent / received per path,
latency percentiles) and exits 0 only when every path delivered everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from gateway.mq.port import Connection, GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import MsgType, PutApplType
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
OHLC_RFH_Q = "DEMO.OHLC.RFH"
OHLC_RFH2_Q = "DEMO.OHLC.RFH2"
REPLY_Q = "DEMO.REPLY"
KAFKA_IN = "demo.to-mq"
MQTT_IN = "demo/to-mq"
TICKS_TOPIC = f"mqgw.{STOCK}"
BARS_TOPIC = "mqgw-analytics.ohlc"
SYMBOLS = ("IBM", "HPQ")
#: MQRFH user name/value pairs the tick feed adds, so viewers can match ticks.
SEQ_PAIR, SENT_PAIR = "DemoSeq", "DemoSent"

PATHS = (
    "MQRFH ticks -> Kafka",
    "MQRFH2 publisher -> Kafka",
    "MQRFH ticks -> MQTT",
    "MQRFH2 publisher -> MQTT",
    "Kafka -> MQRFH subscriber",
    "Kafka -> MQRFH2 subscriber",
    "MQTT -> MQRFH subscriber",
    "MQTT -> MQRFH2 subscriber",
)
OHLC_PATHS = {
    "ohlc bars -> MQ (MQRFH sub)": OHLC_RFH_Q,
    "ohlc bars -> MQ (MQRFH2 sub)": OHLC_RFH2_Q,
}
_SHORT = {
    PATHS[0]: "RFH>K",
    PATHS[1]: "RFH2>K",
    PATHS[2]: "RFH>M",
    PATHS[3]: "RFH2>M",
    PATHS[4]: "K>RFH",
    PATHS[5]: "K>RFH2",
    PATHS[6]: "M>RFH",
    PATHS[7]: "M>RFH2",
    "ohlc bars -> MQ (MQRFH sub)": "bars>RFH",
    "ohlc bars -> MQ (MQRFH2 sub)": "bars>RFH2",
}

#: The first record/message each viewer saw, shown to the user.
SAMPLES: dict[str, str] = {}


class DemoError(Exception):
    """The demo could not run a step (a broker command refused, the Spark job failed)."""

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class PathStats:
    sent: int = 0
    received: int = 0
    latencies: list[float] = field(default_factory=list)
    #: Why the path was not exercised ("" when it was).
    skipped: str = ""

    def add(self, sent_at: float) -> None:
        self.received += 1
        self.latencies.append(max(0.0, time.time() - sent_at))

    @property
    def complete(self) -> bool:
        return bool(self.skipped) or (self.sent > 0 and self.received == self.sent)


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


# ----------------------------------------------------------------- ticks and bars ----


@dataclass(frozen=True, slots=True)
class Tick:
    """One tick of the feed; ``put_cs`` is its MQMD put time in 1/100 s since 1970 UTC."""

    seq: int
    symbol: str
    price: Decimal
    volume: int
    put_cs: int

    @property
    def text(self) -> str:
        """The publication data in the ohlc job's text format ``SYMBOL PRICE VOLUME``."""
        return f"{self.symbol} {self.price} {self.volume}"

    @property
    def minute(self) -> int:
        """Start of the tick's one-minute window, seconds since 1970 UTC."""
        return self.put_cs // 6000 * 60


#: (symbol, window start in seconds since 1970 UTC)
BarKey = tuple[str, int]
#: (open, high, low, close, volume, ticks)
Bar = tuple[Decimal, Decimal, Decimal, Decimal, int, int]


def tick_schedule(count: int, now: float, seed: int = 7) -> list[Tick]:
    """``count`` ticks alternating the symbols, put times spread evenly over the two whole
    minutes before ``now`` (so two one-minute windows; each symbol in both from 4 ticks)."""
    start_cs = (int(now) // 60 - 2) * 6000
    rng = random.Random(seed)
    prices = {"IBM": Decimal("131.25"), "HPQ": Decimal("20.10")}
    ticks = []
    for seq in range(count):
        symbol = SYMBOLS[seq % len(SYMBOLS)]
        moved = prices[symbol] + Decimal(rng.randint(-25, 25)) / 100
        prices[symbol] = max(moved, Decimal("0.01"))
        put_cs = start_cs + seq * 12_000 // count
        ticks.append(Tick(seq, symbol, prices[symbol], rng.randint(1, 50) * 100, put_cs))
    return ticks


def expected_bars(ticks: Sequence[Tick]) -> dict[BarKey, Bar]:
    """The bars the ohlc job must compute: per (symbol, minute), open/close the first/last
    tick by put time, then by feed order (= Kafka offset order on the one partition)."""
    grouped: dict[BarKey, list[Tick]] = {}
    for tick in sorted(ticks, key=lambda t: (t.put_cs, t.seq)):
        grouped.setdefault((tick.symbol, tick.minute), []).append(tick)
    return {
        key: (
            group[0].price,
            max(t.price for t in group),
            min(t.price for t in group),
            group[-1].price,
            sum(t.volume for t in group),
            len(group),
        )
        for key, group in grouped.items()
    }


def parse_bar(payload: bytes) -> tuple[BarKey, Bar] | None:
    """A bar as the ohlc job produces it (JSON, prices as decimal strings), or None."""
    try:
        data = json.loads(payload)
        start = datetime.strptime(data["start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        bar: Bar = (
            Decimal(data["open"]),
            Decimal(data["high"]),
            Decimal(data["low"]),
            Decimal(data["close"]),
            int(data["volume"]),
            int(data["ticks"]),
        )
        return (str(data["symbol"]), int(start.timestamp())), bar
    except (ValueError, TypeError, KeyError, InvalidOperation, UnicodeDecodeError):
        return None


@dataclass
class BarBook:
    """Bars expected from the ticks sent, and the latest version each queue received."""

    expected: dict[BarKey, Bar] = field(default_factory=dict)
    seen: dict[str, dict[BarKey, Bar]] = field(default_factory=dict)

    def receive(self, queue: str, key: BarKey, bar: Bar) -> None:
        # A bar is produced again when a micro-batch changes it: the latest one counts.
        self.seen.setdefault(queue, {})[key] = bar

    def matched(self, queue: str) -> int:
        got = self.seen.get(queue, {})
        return sum(1 for key, bar in self.expected.items() if got.get(key) == bar)

    def mismatches(self, queue: str) -> list[str]:
        got = self.seen.get(queue, {})
        lines = []
        for key, want in sorted(self.expected.items()):
            have = got.get(key)
            if have != want:
                lines.append(f"{_bar_name(key)}: expected {_bar_text(want)}, got "
                             + (_bar_text(have) if have else "nothing"))
        lines += [f"{_bar_name(k)}: unexpected bar {_bar_text(v)}"
                  for k, v in sorted(got.items()) if k not in self.expected]
        return lines


def _bar_name(key: BarKey) -> str:
    return f"{key[0]} {time.strftime('%H:%M', time.gmtime(key[1]))}Z"


def _bar_text(bar: Bar) -> str:
    o, h, lo, c, v, n = bar
    return f"O {o} H {h} L {lo} C {c} V {v} ({n} ticks)"


def put_stamp(put_cs: int) -> tuple[str, str]:
    """MQMD PutDate ``YYYYMMDD`` and PutTime ``HHMMSSTH`` (GMT) of ``put_cs``."""
    tm = time.gmtime(put_cs // 100)
    return time.strftime("%Y%m%d", tm), time.strftime("%H%M%S", tm) + f"{put_cs % 100:02d}"


# ----------------------------------------------------------------- legacy MQ apps ----


def _rfh_command(
    pairs: list[tuple[str, str]], payload: bytes = b"", msg_type: int = MsgType.DATAGRAM
) -> tuple[MQMD, bytes]:
    rfh = MQRFH(name_values=pairs, format=FMT_STRING if payload else "", coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER, msg_type=msg_type, persistence=1, coded_char_set_id=1208)
    if msg_type == MsgType.REQUEST:
        md.reply_to_q = REPLY_Q
    return md, encode_rfh(rfh, ccsid=1208) + payload


def _rfh2_command(
    psc: list[tuple[str, str]],
    payload: bytes = b"",
    usr: dict[str, str] | None = None,
    msg_type: int = MsgType.DATAGRAM,
) -> tuple[MQMD, bytes]:
    folders = [Element.from_pairs("psc", psc)]
    if usr:
        folders.append(Element.from_pairs("usr", usr))
    rfh2 = MQRFH2(folders=folders, format=FMT_STRING if payload else "", coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER_2, msg_type=msg_type, persistence=1, coded_char_set_id=1208)
    if msg_type == MsgType.REQUEST:
        md.reply_to_q = REPLY_Q
    return md, encode_rfh2(rfh2, ccsid=1208) + payload


#: (what, header kind, command) of every subscription the demo registers.
SUBSCRIPTIONS: tuple[tuple[str, str, list[tuple[str, str]]], ...] = (
    (f"{RFH_SUB_Q}: MQRFH, stream {STOCK}, topic *", "rfh", [
        ("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "*"),
        ("MQPSQName", RFH_SUB_Q)]),
    (f"{RFH2_SUB_Q}: MQRFH2, topic $SYS/STREAM/{STOCK}/#", "rfh2", [
        ("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{STOCK}/#"), ("QName", RFH2_SUB_Q)]),
    (f"{OHLC_RFH_Q}: MQRFH, stream {STOCK}, topic OHLC/1m/*", "rfh", [
        ("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "OHLC/1m/*"),
        ("MQPSQName", OHLC_RFH_Q)]),
    (f"{OHLC_RFH2_Q}: MQRFH2, topic $SYS/STREAM/{STOCK}/OHLC/1m/+", "rfh2", [
        ("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{STOCK}/OHLC/1m/+"),
        ("QName", OHLC_RFH2_Q)]),
)


async def register_subscribers(conn: Connection) -> None:
    """RegSub as requests; each broker response must say OK (else DemoError)."""
    replies = await conn.open(REPLY_Q, OpenOption.INPUT_EXCLUSIVE)
    try:
        for what, kind, pairs in SUBSCRIPTIONS:
            if kind == "rfh":
                md, body = _rfh_command(pairs, msg_type=MsgType.REQUEST)
            else:
                md, body = _rfh2_command(pairs, msg_type=MsgType.REQUEST)
            await conn.put1(CONTROL_QUEUE, md, body, PutOptions())
            try:
                reply = await replies.get(GetOptions(wait_ms=10_000))
            except MQError as exc:
                raise DemoError(f"no broker response to RegSub ({what}): {exc}",
                                step="subscribe") from exc
            outcome = _response_outcome(reply.md, reply.body)
            if outcome != "ok":
                raise DemoError(f"RegSub refused ({what}): {outcome}", step="subscribe")
            print(f"  subscribed {what}")
    finally:
        await replies.close()


def _response_outcome(md: MQMD, body: bytes) -> str:
    """``ok``, or the broker's reason from an MQRFH / MQRFH2 (pscr) response."""
    if md.format == FMT_RF_HEADER:
        rfh, _ = decode_rfh(body, md.encoding, ccsid=md.coded_char_set_id)
        if rfh.get("MQPSCompCode") == "0":
            return "ok"
        return f"MQPSReason {rfh.get('MQPSReason')} {rfh.get('MQPSReasonText', '')}".strip()
    rfh2, _ = decode_rfh2(body, md.encoding, ccsid=md.coded_char_set_id)
    if rfh2.get("pscr", "Completion") == "ok":
        return "ok"
    return f"pscr Completion {rfh2.get('pscr', 'Completion')} Reason " + str(
        rfh2.get("pscr", "Response/Reason")
    )


async def publish_legacy(
    conn: Connection, ticks: Sequence[Tick], count: int, stats: dict[str, PathStats]
) -> None:
    """The MQRFH tick feed and the MQRFH2 bulletin publisher, interleaved.

    The feed puts with MQPMO_SET_ALL_CONTEXT: PutDate/PutTime are the tick's own times
    (what the ohlc job buckets on), as a feed handler replaying exchange times sets them.
    """
    feed = await conn.open(STOCK, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
    try:
        for seq in range(max(count, len(ticks))):
            if seq < len(ticks):
                tick = ticks[seq]
                md, body = _rfh_command(
                    [
                        ("MQPSCommand", "Publish"),
                        ("MQPSStreamName", STOCK),
                        ("MQPSTopic", f"{tick.symbol}/Latest"),
                        (SEQ_PAIR, str(tick.seq)),
                        (SENT_PAIR, f"{time.time():.6f}"),
                    ],
                    tick.text.encode(),
                )
                md.put_date, md.put_time = put_stamp(tick.put_cs)
                md.put_appl_type = PutApplType.UNIX
                md.put_appl_name = "mqgw-demo tick feed"
                md.user_identifier = "mqgwdemo"
                await feed.put(md, body, PutOptions(set_all_context=True))
                stats[PATHS[0]].sent += 1
                stats[PATHS[2]].sent += 1
            if seq < count:
                md, body = _rfh2_command(
                    [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{BULLETIN}/News/Markets")],
                    _body("rfh2", seq),
                    usr={"Desk": "London"},
                )
                await conn.put1("SYSTEM.BROKER.DEFAULT.STREAM", md, body, PutOptions())
                stats[PATHS[1]].sent += 1
                stats[PATHS[3]].sent += 1
            await asyncio.sleep(0.005)
    finally:
        await feed.close()


def _strip_header(md: MQMD, body: bytes) -> tuple[str, bytes]:
    """(topic as delivered, publication data) of a message on a subscriber queue."""
    if md.format == FMT_RF_HEADER:
        rfh, used = decode_rfh(body, md.encoding, ccsid=md.coded_char_set_id)
        return rfh.get("MQPSTopic") or "", body[used:]
    if md.format == FMT_RF_HEADER_2:
        rfh2, used = decode_rfh2(body, md.encoding, ccsid=md.coded_char_set_id)
        return rfh2.get("psc", "Topic") or "", body[used:]
    return "", body


async def read_subscribers(
    conn: Connection, stats: dict[str, PathStats], book: BarBook, stop: asyncio.Event
) -> None:
    """Drain the four subscriber queues, counting what each path delivered."""
    queues = (RFH_SUB_Q, RFH2_SUB_Q, OHLC_RFH_Q, OHLC_RFH2_Q)
    handles = {q: await conn.open(q, OpenOption.INPUT_SHARED) for q in queues}
    bar_rows = {q: name for name, q in OHLC_PATHS.items()}
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
            topic, data_bytes = _strip_header(m.md, m.body)
            if queue in bar_rows:
                bar = parse_bar(data_bytes)
                if bar is None:
                    log.warning("%s: not a bar on topic %r: %r", queue, topic, data_bytes[:80])
                    continue
                book.receive(queue, *bar)
                if bar_rows[queue] in stats:
                    stats[bar_rows[queue]].received = book.matched(queue)
                kind = "MQRFH" if queue == OHLC_RFH_Q else "MQRFH2"
                SAMPLES.setdefault(f"bar {kind}", f"{queue} got topic={topic} "
                                   f"data={data_bytes.decode(errors='replace')}")
                continue
            data = _parse(data_bytes)
            if data is None or data["path"] not in ("kafka", "mqtt"):
                continue
            source = "Kafka" if data["path"] == "kafka" else "MQTT"
            kind = "MQRFH" if queue == RFH_SUB_Q else "MQRFH2"
            stats[f"{source} -> {kind} subscriber"].add(float(data["sent"]))
        if not got_any:
            await asyncio.sleep(0.02)


# ----------------------------------------------------------------- modern clients ----


def _sent_at(pairs: Sequence[tuple[str, str]]) -> float | None:
    for name, value in pairs:
        if name == SENT_PAIR:
            with contextlib.suppress(ValueError):
                return float(value)
    return None


async def kafka_consumer(
    bootstrap: str, stats: dict[str, PathStats], ready: asyncio.Event, stop: asyncio.Event
) -> None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        TICKS_TOPIC,
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
                    headers = [(k, v.decode(errors="replace")) for k, v in r.headers]
                    tick_sent = _sent_at([(k.removeprefix("mq.nv."), v) for k, v in headers])
                    if tick_sent is not None:
                        stats[PATHS[0]].add(tick_sent)
                        h = dict(headers)
                        SAMPLES.setdefault("Kafka tick", (
                            f"topic={r.topic} key={r.key!r} value={r.value!r} "
                            f"mq.putTime={h.get('mq.putTime')} mq.pubHeader="
                            f"{h.get('mq.pubHeader')} mq.nv.{SEQ_PAIR}={h.get('mq.nv.' + SEQ_PAIR)}"
                        ))
                        continue
                    data = _parse(r.value or b"")
                    if data is None or data["path"] != "rfh2":
                        continue
                    stats[PATHS[1]].add(float(data["sent"]))
                    SAMPLES.setdefault("Kafka bulletin", f"topic={r.topic} key={r.key!r} "
                                       "headers=" + ", ".join(
                                           f"{k}={v}" for k, v in headers
                                           if k in ("mq.stream", "mq.topic", "mq.pubHeader",
                                                    "usr.Desk")))
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
            props = getattr(msg.properties, "UserProperty", None) if msg.properties else None
            pairs = [(str(k), str(v)) for k, v in props] if props else []
            tick_sent = _sent_at(pairs)
            if tick_sent is not None:
                stats[PATHS[2]].add(tick_sent)
                continue
            if parse_bar(payload) is not None:
                SAMPLES.setdefault("MQTT bar", f"topic={msg.topic} payload={payload.decode()}")
                continue
            data = _parse(payload)
            if data is None or data["path"] != "rfh2":
                continue
            SAMPLES.setdefault("MQTT bulletin", f"topic={msg.topic} qos={msg.qos} "
                               f"user_properties={props}")
            stats[PATHS[3]].add(float(data["sent"]))


async def mqtt_publisher(host: str, port: int, count: int, stats: dict[str, PathStats]) -> None:
    import aiomqtt

    async with aiomqtt.Client(host, port, identifier="mqgw-demo-sender") as client:
        for seq in range(count):
            await client.publish(f"{MQTT_IN}/FromMqtt/Quote", _body("mqtt", seq), qos=1)
            stats["MQTT -> MQRFH subscriber"].sent += 1
            stats["MQTT -> MQRFH2 subscriber"].sent += 1


# ----------------------------------------------------------------- the ohlc job ------


@dataclass
class JobRun:
    """One ``mqgw analytics ohlc --once`` process: outcome, wall time, log."""

    argv: list[str]
    log_path: Path
    pgid: int = 0
    returncode: int | None = None
    seconds: float = 0.0


def mqgw_command() -> list[str]:
    """``mqgw`` next to this interpreter (the venv's), else ``python -m`` the CLI."""
    script = Path(sys.executable).with_name("mqgw")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "gateway.runtime.cli"]


def _kill_group(pgid: int) -> None:
    """Stop the job: SIGTERM to ``mqgw`` (it stops its queries and cleans up), then
    SIGTERM and SIGKILL to its whole process group (Spark's JVM is in it)."""
    steps = ((os.kill, signal.SIGTERM, 15.0), (os.killpg, signal.SIGTERM, 5.0),
             (os.killpg, signal.SIGKILL, 5.0))
    for send, sig, wait_s in steps:
        try:
            send(pgid, sig)
        except ProcessLookupError:
            if not _group_alive(pgid):
                return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def run_ohlc_job(bootstrap: str, work: Path, timeout: float, job: JobRun) -> JobRun:
    """Run the ohlc job once as a process (gateway/ never imports analytics), echoing its
    progress lines; Spark's own log goes to ``job.log_path``. Killed on timeout/cancel.

    Its JVM's temporary files go under ``work`` (``java.io.tmpdir``), not /tmp.
    """
    started = time.monotonic()
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env["JAVA_TOOL_OPTIONS"] = (env.get("JAVA_TOOL_OPTIONS", "")
                                + f" -Djava.io.tmpdir={tmp}").strip()
    env["TMPDIR"] = str(tmp)
    with job.log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *job.argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
            stdin=asyncio.subprocess.DEVNULL,
            cwd=work,
            env=env,
            start_new_session=True,
        )
        job.pgid = proc.pid
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                async for raw in proc.stdout:
                    line = raw.decode(errors="replace").rstrip()
                    log_file.write(raw)
                    log_file.flush()
                    if line:
                        print(f"    spark | {line}", flush=True)
                job.returncode = await proc.wait()
        except (TimeoutError, asyncio.CancelledError) as exc:
            await asyncio.to_thread(_kill_group, proc.pid)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            print(f"    spark | no result after {timeout:.0f} s: stopped")
        finally:
            job.seconds = time.monotonic() - started
        if _group_alive(proc.pid):  # a JVM that outlived its driver
            await asyncio.to_thread(_kill_group, proc.pid)
    return job


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


# ----------------------------------------------------------------- orchestration -----


def gateway_config(work: Path, bootstrap: str, mqtt_host: str, mqtt_port: int) -> dict[str, Any]:
    """The gateway the demo runs (examples/demo.yaml is the same as a file)."""
    queues = (RFH_SUB_Q, RFH2_SUB_Q, OHLC_RFH_Q, OHLC_RFH2_Q, REPLY_Q)
    (work / "demo.mqsc").write_text("".join(f"DEFINE QLOCAL({q}) REPLACE\n" for q in queues))
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
                    "inbound": {
                        "topics": [
                            {"kafka_topic": KAFKA_IN, "stream": STOCK},
                            # The ohlc job's bars (key/mq.topic OHLC/1m/<SYMBOL>).
                            {"kafka_topic": BARS_TOPIC, "stream": STOCK},
                        ]
                    },
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


class Progress:
    """One live line: rewritten in place on a terminal, a line every 2 s otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0
        self.text = ""

    def show(self, stats: dict[str, PathStats], names: Sequence[str], final: bool = False) -> None:
        now = time.monotonic()
        if not (final or self.tty or now - self.last >= 2.0):
            return
        self.last = now
        parts = [f"{_SHORT[n]} {stats[n].received}/{stats[n].sent}" for n in names]
        text = "  " + "  ".join(parts)
        if self.tty:
            sys.stdout.write("\r" + text + ("\n" if final else ""))
        elif text != self.text:
            sys.stdout.write(text + "\n")
        self.text = text
        sys.stdout.flush()


async def wait_delivered(
    stats: dict[str, PathStats], names: Sequence[str], timeout: float, progress: Progress
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress.show(stats, names)
        if all(stats[n].complete for n in names):
            break
        await asyncio.sleep(0.25)
    progress.show(stats, names, final=True)


@dataclass
class DemoRun:
    """Everything the summary reports."""

    stats: dict[str, PathStats]
    book: BarBook
    job: JobRun | None = None
    #: Process groups started (name -> pgid), to prove nothing outlives the demo.
    process_groups: dict[str, int] = field(default_factory=dict)
    failure: str = ""


async def exercise(
    bootstrap: str,
    mqtt_host: str,
    mqtt_port: int,
    count: int,
    timeout: float,
    work: Path,
    run: DemoRun | None = None,
    analytics: bool = False,
) -> dict[str, PathStats]:
    """Run the gateway against running brokers and drive every path; the statistics.

    Without ``run`` (tests/runtime/test_gateway_e2e.py) only the eight bridge paths are
    counted; ``analytics`` adds the ohlc loop (a Spark process) to ``run``'s rows.
    """
    if run is None:
        run = DemoRun(stats={name: PathStats() for name in PATHS}, book=BarBook())
    stats = run.stats
    ticks = tick_schedule(count, time.time())
    run.book.expected = expected_bars(ticks)
    for name in OHLC_PATHS:
        if name not in stats:
            continue
        if analytics:
            stats[name].sent = len(run.book.expected)
        else:
            stats[name].skipped = "skipped (--no-analytics)"
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(
        gateway_config(work, bootstrap, mqtt_host, mqtt_port), registry, base_dir=work
    )
    app = GatewayApp(loaded, registry)
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    progress = Progress()
    await app.start()
    try:
        async with asyncio.timeout(60):
            while not app.health()[0]:
                await asyncio.sleep(0.1)
        port = app.http.port if app.http else 0
        print(f"  gateway up: embedded QM1, streams {STOCK} and {BULLETIN}; "
              f"metrics http://127.0.0.1:{port}/metrics")
        assert app.qm is not None
        conn = await app.qm.connect()
        reader = await app.qm.connect()
        await register_subscribers(conn)
        kafka_ready, mqtt_ready = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(kafka_consumer(bootstrap, stats, kafka_ready, stop)),
            asyncio.create_task(mqtt_subscriber(mqtt_host, mqtt_port, stats, mqtt_ready, stop)),
            asyncio.create_task(read_subscribers(reader, stats, run.book, stop)),
        ]
        async with asyncio.timeout(60):
            await kafka_ready.wait()
            await mqtt_ready.wait()
        await asyncio.sleep(1.0)  # subscriptions registered, consumers assigned
        first = time.strftime("%H:%M", time.gmtime(ticks[0].put_cs // 100)) if ticks else "-"
        print(f"[2/4] sending {count} messages on each path; {len(ticks)} ticks for "
              f"{', '.join(SYMBOLS)} put-timed over the two minutes from {first}Z")
        await publish_legacy(conn, ticks, count, stats)
        await kafka_producer(bootstrap, count, stats)
        await mqtt_publisher(mqtt_host, mqtt_port, count, stats)
        await wait_delivered(stats, PATHS, timeout, progress)
        if not analytics:
            print("[3/4] analytics skipped (--no-analytics)")
        elif not stats[PATHS[0]].complete:
            run.failure = "the ticks did not all reach Kafka: the ohlc job was not run"
            print(f"[3/4] {run.failure}")
        else:
            run.job = JobRun(
                argv=[*mqgw_command(), "analytics", "ohlc", "--bootstrap", bootstrap,
                      "--topics", TICKS_TOPIC, "--out", str(work / "analytics"), "--once"],
                log_path=work / "ohlc-job.log",
            )
            print("[3/4] ticks are in Kafka: running the Spark ohlc job once "
                  f"(its log: {run.job.log_path})")
            print("    $ " + " ".join(["mqgw", *run.job.argv[len(mqgw_command()):]]))
            await run_ohlc_job(bootstrap, work, max(timeout, 300.0), run.job)
            run.process_groups["ohlc job"] = run.job.pgid
            if run.job.returncode == 0:
                print(f"    ohlc job done in {run.job.seconds:.1f} s; waiting for "
                      f"{len(run.book.expected)} bars at {OHLC_RFH_Q} and {OHLC_RFH2_Q}")
                await wait_delivered(stats, list(OHLC_PATHS), timeout, progress)
            else:
                run.failure = (f"the ohlc job exited with {run.job.returncode}; "
                               f"last lines of {run.job.log_path}:\n"
                               + _log_tail(run.job.log_path))
                print("    " + run.failure)
        await conn.disconnect()
    finally:
        stop.set()
        for t in tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(t, 5)
        await app.shutdown()
    return stats


def summary_rows(stats: dict[str, PathStats]) -> list[dict[str, Any]]:
    """The summary table as data (``--json-summary``); latencies in ms, None when none."""
    rows = []
    for name, s in stats.items():
        p = [percentile(s.latencies, q) * 1000 for q in (50, 95, 99)]
        rows.append({
            "path": name,
            "sent": s.sent,
            "received": s.received,
            "p50_ms": None if s.skipped or not s.latencies else round(p[0], 1),
            "p95_ms": None if s.skipped or not s.latencies else round(p[1], 1),
            "p99_ms": None if s.skipped or not s.latencies else round(p[2], 1),
            "status": "skipped" if s.skipped else ("ok" if s.complete else "short"),
            "note": s.skipped,
        })
    return rows


def summary(stats: dict[str, PathStats]) -> str:
    width = max(len(n) for n in stats)
    header = (f"{'path':<{width}} {'sent':>6} {'received':>9} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    lines = [header, "-" * len(header)]
    for row in summary_rows(stats):
        if row["status"] == "skipped":
            lines.append(f"{row['path']:<{width}} {'-':>6} {'-':>9}  {row['note']}")
            continue
        p = [f"{row[k]:>8.1f}" if row[k] is not None else f"{'-':>8}"
             for k in ("p50_ms", "p95_ms", "p99_ms")]
        lines.append(f"{row['path']:<{width}} {row['sent']:>6} {row['received']:>9} "
                     + " ".join(p))
    return "\n".join(lines)


def report(run: DemoRun) -> bool:
    """Print the samples and the summary table; True when every path delivered all."""
    stats = run.stats
    print()
    for who, text in sorted(SAMPLES.items()):
        print(f"  sample, {who}: {text}")
    got = run.book.seen.get(OHLC_RFH_Q, {})
    if got:
        print(f"\n  bars received at {OHLC_RFH_Q} (= ticks sent, recomputed here):")
        for key, bar in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            mark = "ok" if run.book.expected.get(key) == bar else "DIFFERS"
            print(f"    {_bar_name(key)}  {_bar_text(bar)}  {mark}")
    if run.job is not None and run.job.returncode == 0:
        for name, queue in OHLC_PATHS.items():
            if not stats[name].complete:
                for line in run.book.mismatches(queue):
                    print(f"  {queue}: {line}")
    print()
    print(summary(stats))
    if run.job is not None:
        state = "exit 0" if run.job.returncode == 0 else f"exit {run.job.returncode}"
        print(f"ohlc job (Spark, --once): {state}, {run.job.seconds:.1f} s; "
              f"{len(run.book.expected)} bars expected from the ticks sent")
    ok = not run.failure and all(s.complete for s in stats.values())
    print()
    print("demo: every path delivered everything" if ok else "demo: some paths fell short")
    return ok


def write_json_summary(path: Path, run: DemoRun, ok: bool, count: int, seconds: float) -> None:
    data = {
        "ok": ok,
        "count": count,
        "wall_s": round(seconds, 1),
        "failure": run.failure,
        "paths": summary_rows(run.stats),
        "bars_expected": len(run.book.expected),
        "ohlc_job": None if run.job is None else {
            "returncode": run.job.returncode, "seconds": round(run.job.seconds, 1),
            "argv": run.job.argv},
        "process_groups": run.process_groups,
    }
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


async def run_demo(
    count: int, timeout: float, work: Path, analytics: bool, run: DemoRun
) -> bool:
    from gateway.devstack.kafka import KafkaBroker
    from gateway.devstack.mosquitto import MosquittoBroker

    # SIGTERM stops the demo like Ctrl-C does: cancelled, it stops what it started.
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    print("[1/4] starting Mosquitto and Kafka on 127.0.0.1 (free ports) ...")
    mqtt = MosquittoBroker(work / "mosquitto")
    kafka = KafkaBroker(work / "kafka")
    try:
        await asyncio.to_thread(mqtt.start)
        if mqtt.process is not None:
            run.process_groups["mosquitto"] = mqtt.process.pid
        await asyncio.to_thread(kafka.start)
        if kafka.process is not None:
            run.process_groups["kafka"] = kafka.process.pid
        print(f"  Mosquitto on {mqtt.host}:{mqtt.port}, Kafka on {kafka.bootstrap}")
        await exercise(kafka.bootstrap, mqtt.host, mqtt.port, count, timeout, work,
                       run=run, analytics=analytics)
    except DemoError as exc:
        run.failure = f"{exc.step}: {exc}"
        print(f"demo: {run.failure}")
    finally:
        print("[4/4] stopping the gateway, Kafka and Mosquitto ...")
        await asyncio.to_thread(kafka.stop)
        await asyncio.to_thread(mqtt.stop)
    return report(run)


def _configure_logging(work: Path) -> Path:
    """Warnings to the console, everything from INFO to ``<work>/gateway.log``."""
    log_path = work / "gateway.log"
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.WARNING)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    # aiokafka logs start-up races (topic not created yet) at ERROR; they resolve alone,
    # so they go to the file only.
    console.addFilter(lambda record: not record.name.startswith("aiokafka"))
    to_file = logging.FileHandler(log_path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    root.addHandler(to_file)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    return log_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.demo", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--count", type=int, default=200,
                        help="messages per path, and ticks (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds to wait for delivery on each phase (default %(default)s)")
    parser.add_argument("--no-analytics", action="store_true",
                        help="skip the Spark ohlc job (the bars row says skipped)")
    parser.add_argument("--json-summary", type=Path, metavar="PATH",
                        help="also write the summary table as JSON to PATH")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, queue manager, Kafka data)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="mqgw-demo-"))
    gateway_log = _configure_logging(work)
    print(f"mqgw demo: {args.count} messages per path"
          + ("" if not args.no_analytics else ", analytics skipped"))
    print(f"  work directory {work}: logs gateway.log, kafka/kafka.log, "
          "mosquitto/mosquitto.log, ohlc-job.log")
    print("  (removed at the end unless --keep; kept when the demo fails; Ctrl-C stops "
          "everything)")
    run = DemoRun(
        stats={name: PathStats() for name in (*PATHS, *OHLC_PATHS)}, book=BarBook()
    )
    started = time.monotonic()
    ok = False
    try:
        ok = asyncio.run(run_demo(args.count, args.timeout, work, not args.no_analytics, run))
    except (KeyboardInterrupt, asyncio.CancelledError):
        run.failure = "interrupted"
        print("\ndemo: interrupted; everything it started is stopped")
    finally:
        seconds = time.monotonic() - started
        if args.json_summary:
            write_json_summary(args.json_summary, run, ok, args.count, seconds)
        logging.getLogger().handlers.clear()
        if args.keep or not ok:
            print(f"work directory kept: {work} (gateway log: {gateway_log}); "
                  f"clean up with: rm -rf {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
            print("nothing left running; work directory removed")
        print(f"demo took {seconds:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
