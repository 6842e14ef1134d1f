"""ohlc over real Kafka and local Spark: bars computed by hand, Parquet and Kafka out."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from analytics import contract as c
from analytics.job import JobOptions
from analytics.jobs import ohlc
from analytics.runner import run_job
from analytics.source import KafkaInput
from tests.analytics.bridged import Publication, consume_all, hour_start_ms, produce, unique

MIN = 60_000


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(tzinfo=None)


def test_ohlc_bars_to_parquet_and_kafka(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    t0 = hour_start_ms()
    stream = unique("STOCK.")
    other = unique("OTHER.")
    ktopic = f"mqgw.{stream}"
    bars_topic = unique("bars.")
    ticks = [
        Publication(stream, "IBM/Latest", b"IBM 100.50 10", t0 + 1_000),
        Publication(stream, "HPQ/Latest", b"HPQ 20.1", t0 + 1_500),  # no volume -> 0
        Publication(stream, "IBM/Latest", b"IBM 101.25 5", t0 + 2_000),
        Publication(stream, "IBM/Latest", b"not a tick", t0 + 2_500),  # ignored
        Publication(stream, "IBM/Latest", b"  IBM   99.75   20 ", t0 + 3_000),
        Publication(stream, "IBM/Latest", b'{"symbol": "IBM", "price": 100.00, "volume": 1}',
                    t0 + 59_990),
        Publication(stream, "HPQ/Latest", b"HPQ 19.9 100", t0 + 4_000),
        # minute 1
        Publication(stream, "IBM/Latest", b'{"symbol":"IBM","price":102.5,"volume":7}',
                    t0 + MIN + 10),
        Publication(stream, "IBM/Latest", b"IBM 102.40 3", t0 + MIN + 20),
        # a tombstone and a publication on another stream are not ticks
        Publication(stream, "IBM/Latest", None, t0 + MIN + 30),
        Publication(other, "IBM/Latest", b"IBM 1.00 1", t0 + MIN + 40),
    ]
    produce(kafka_broker.bootstrap, ktopic, ticks)

    source = KafkaInput(kafka_broker.bootstrap, topics=(ktopic,), max_offsets_per_trigger=4)
    options = JobOptions(source=source, out=str(tmp_path / "out"), extra={
        "stream": stream, "bars_topic": bars_topic, "bars_stream": stream,
        "bars_mq_topic": "Bars/{symbol}/1m"})
    result = run_job(spark_session, "ohlc", ohlc.build, options,
                     checkpoint=str(tmp_path / "ckpt"), once=True)
    assert result.stats["ohlc"].rows == len(ticks)

    D = Decimal
    # By hand: IBM minute 0 ticks 100.50x10, 101.25x5, 99.75x20, 100.00x1 (by put time).
    expected = {
        ("IBM", _ts(t0)): (D("100.50"), D("101.25"), D("99.75"), D("100.00"), 36, 4),
        ("HPQ", _ts(t0)): (D("20.1"), D("20.1"), D("19.9"), D("19.9"), 100, 2),
        ("IBM", _ts(t0 + MIN)): (D("102.5"), D("102.5"), D("102.40"), D("102.40"), 10, 2),
    }
    rows = spark_session.read.schema(ohlc.BARS_SCHEMA).parquet(
        str(tmp_path / "out" / "ohlc")).collect()
    got = {(r.symbol, r.window_start): (r.open, r.high, r.low, r.close, r.volume, r.ticks)
           for r in rows}
    assert got == expected
    assert {r.stream for r in rows} == {stream}
    assert {r.date for r in rows} == {_ts(t0).date()}

    # Kafka: every version of a bar carries the same correlId; the last one is final.
    records: list[Any] = consume_all(kafka_broker.bootstrap, bars_topic, expected=3)
    assert len(records) >= 3
    latest: dict[bytes, Any] = {}
    for rec in records:
        headers = dict(rec.headers)
        assert len(rec.headers) == len(headers), "a header appears twice"
        assert headers[c.H_CONTRACT] == b"1"
        assert headers[c.H_STREAM] == stream.encode()
        assert rec.key == headers[c.H_TOPIC]
        assert len(headers[c.H_MSG_ID]) == 24 and len(headers[c.H_CORREL_ID]) == 24
        assert int(headers[c.H_PUT_TIME]) > t0
        assert (headers[c.H_FORMAT], headers[c.H_ENCODING], headers[c.H_CCSID]) == (
            b"MQSTR", b"546", b"1208")
        assert headers[c.H_PUB_HEADER] == b"MQRFH2" and headers[c.H_RETAIN] == b"1"
        assert headers[c.H_ORIGIN] == ohlc.ORIGIN.encode()
        latest[headers[c.H_CORREL_ID]] = rec
    assert len({dict(r.headers)[c.H_MSG_ID] for r in records}) == len(records)
    assert len(latest) == 3
    bars = {}
    for rec in latest.values():
        bar = json.loads(rec.value)
        assert rec.key == f"Bars/{bar['symbol']}/1m".encode()
        assert dict(rec.headers)["usr.Symbol"] == bar["symbol"].encode()
        start = datetime.strptime(bar["start"], "%Y-%m-%dT%H:%M:%SZ")
        bars[(bar["symbol"], start)] = (D(bar["open"]), D(bar["high"]), D(bar["low"]),
                                        D(bar["close"]), bar["volume"], bar["ticks"])
    assert bars == expected
    ibm0 = next(json.loads(r.value) for r in latest.values()
                if json.loads(r.value)["start"].endswith(_ts(t0).strftime("%H:%M:%SZ"))
                and json.loads(r.value)["symbol"] == "IBM")
    assert ibm0["open"] == "100.5" and ibm0["close"] == "100"
