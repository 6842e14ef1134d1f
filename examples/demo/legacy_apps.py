"""The legacy MQ applications the demo plays: MQRFH/MQRFH2 subscribers registering
with the broker, the MQRFH tick feed and the MQRFH2 bulletin publisher, and the reader
draining the subscriber queues.

They speak only the queue-manager port and the wire codecs, as an application on a real
queue manager would: the gateway is a broker node to them. The demo runs each as a
separate process connected to the gateway's queue manager through its local socket
(:mod:`examples.demo.legacy_process`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from examples.demo.bars import BarBook, Tick, parse_bar, put_stamp
from examples.demo.paths import (
    BULLETIN,
    OHLC_PATHS,
    OHLC_RFH2_Q,
    OHLC_RFH_Q,
    PATHS,
    REPLY_Q,
    RFH2_SUB_Q,
    RFH_SUB_Q,
    SAMPLES,
    SENT_PAIR,
    SEQ_PAIR,
    STOCK,
    PathStats,
    parse_path_body,
    path_body,
)
from gateway.mq.port import Connection, GetOptions, MQError, OpenOption, PutOptions
from gateway.pubsub.streams import CONTROL_QUEUE
from gateway.wire.constants import MsgType, PutApplType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2

log = logging.getLogger(__name__)


class DemoError(Exception):
    """The demo could not run a step (a broker command refused, the Spark job failed)."""

    def __init__(self, message: str, *, step: str) -> None:
        super().__init__(message)
        self.step = step


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
                    path_body("rfh2", seq),
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


#: Most messages a sweep of the subscriber queues gets from one queue before committing.
SWEEP_BATCH = 100
#: The subscriber queues the reader drains.
SUBSCRIBER_QUEUES = (RFH_SUB_Q, RFH2_SUB_Q, OHLC_RFH_Q, OHLC_RFH2_Q)


async def drain_subscribers(
    conn: Connection, on_message: Callable[[str, str, bytes], None], stop: asyncio.Event
) -> None:
    """Get from the four subscriber queues until ``stop``; ``on_message(queue, topic,
    data)`` for each publication (its MQRFH/MQRFH2 removed).

    As an MQ application of persistent messages does: gets under syncpoint, what a
    sweep of the queues got (up to ``SWEEP_BATCH`` a queue) committed at once; a get
    outside syncpoint would be a unit of work, a disk write, per message."""
    handles = {q: await conn.open(q, OpenOption.INPUT_SHARED) for q in SUBSCRIBER_QUEUES}
    options = GetOptions(wait_ms=0, syncpoint=True)
    while not stop.is_set():
        got_any = False
        for queue, handle in handles.items():
            for _ in range(SWEEP_BATCH):
                try:
                    m = await handle.get(options)
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        break
                    raise
                got_any = True
                topic, data_bytes = _strip_header(m.md, m.body)
                on_message(queue, topic, data_bytes)
        if got_any:
            await conn.commit()
        else:
            await asyncio.sleep(0.02)


def record_delivery(
    queue: str, topic: str, data_bytes: bytes, stats: dict[str, PathStats], book: BarBook
) -> None:
    """Count one publication a subscriber queue delivered against its path."""
    bar_rows = {q: name for name, q in OHLC_PATHS.items()}
    if queue in bar_rows:
        bar = parse_bar(data_bytes)
        if bar is None:
            log.warning("%s: not a bar on topic %r: %r", queue, topic, data_bytes[:80])
            return
        book.receive(queue, *bar)
        if bar_rows[queue] in stats:
            stats[bar_rows[queue]].received = book.matched(queue)
        kind = "MQRFH" if queue == OHLC_RFH_Q else "MQRFH2"
        SAMPLES.setdefault(f"bar {kind}", f"{queue} got topic={topic} "
                           f"data={data_bytes.decode(errors='replace')}")
        return
    data = parse_path_body(data_bytes)
    if data is None or data["path"] not in ("kafka", "mqtt"):
        return
    source = "Kafka" if data["path"] == "kafka" else "MQTT"
    kind = "MQRFH" if queue == RFH_SUB_Q else "MQRFH2"
    stats[f"{source} -> {kind} subscriber"].add(float(data["sent"]))


async def read_subscribers(
    conn: Connection, stats: dict[str, PathStats], book: BarBook, stop: asyncio.Event
) -> None:
    """Drain the four subscriber queues, counting what each path delivered."""
    await drain_subscribers(
        conn, lambda q, t, d: record_delivery(q, t, d, stats, book), stop
    )
