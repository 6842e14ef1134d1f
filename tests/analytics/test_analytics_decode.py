"""The built-in header lookup decodes exactly what the former higher-order form did.

``analytics.records.header_bytes`` finds a header with ``array_position`` over the keys
(compiled into Spark's generated code); it replaced ``filter(headers, h -> h.key = name)``
(interpreted row by row). Both are run here over generated Kafka-source rows - every
contract header present, missing, duplicated, null, empty, non-numeric, out of range,
no headers at all - and ``decode_records`` / ``decode_deadletters`` must give the same
rows either way.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics import contract as c
from analytics import records

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])

CONTRACT_HEADERS = [
    c.H_CONTRACT, c.H_STREAM, c.H_TOPIC, c.H_MSG_ID, c.H_CORREL_ID, c.H_PUT_TIME,
    c.H_USER_ID, c.H_FORMAT, c.H_ENCODING, c.H_CCSID, c.H_PERSISTENCE, c.H_PUB_HEADER,
    c.H_RETAIN, c.H_SEQ_NUM, c.H_PUB_TIME, c.H_ORIGIN, c.H_DLH_REASON, c.H_DLH_DEST_Q,
    c.H_DLH_DEST_Q_MGR,
]
NUMERIC = {c.H_PUT_TIME, c.H_ENCODING, c.H_CCSID, c.H_PERSISTENCE, c.H_SEQ_NUM,
           c.H_DLH_REASON}
ODD_NUMBERS = [b"", b" 42 ", b"-1", b"12x", b"9" * 19, b"253402300800000", b"0",
               b"1700000000000", b"+5", b"\xff\xfe"]


def lambda_header_bytes(name: str, headers: str = "headers") -> Column:
    """The former lookup, kept here as the reference the new one must match."""
    quoted = name.replace("\\", "\\\\").replace("'", "\\'")
    return F.expr(f"try_element_at(filter({headers}, h -> h.key = '{quoted}'), 1).value")


def _value(rng: random.Random, name: str, n: int) -> bytes | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    if name in NUMERIC:
        if roll < 0.3:
            return rng.choice(ODD_NUMBERS)
        if name == c.H_PUT_TIME:
            return str(1_700_000_000_000 + n * 997).encode()
        return str(rng.randrange(0, 2_000)).encode()
    if name in (c.H_MSG_ID, c.H_CORREL_ID):
        return n.to_bytes(24, "big") if roll > 0.2 else b"short"
    if name == c.H_RETAIN:
        return rng.choice([b"1", b"0", b"true", b""])
    return rng.choice([b"STREAM.A", b"IBM/Latest", "caf\u00e9/\u00fcber".encode(), b"",
                       b"it's", b"back\\slash"])


def generated_rows(count: int, seed: int = 16) -> list[tuple[Any, ...]]:
    """Kafka-source rows with every kind of header set the decoder must survive."""
    rng = random.Random(seed)
    rows: list[tuple[Any, ...]] = []
    for n in range(count):
        present: list[tuple[str, bytes | None]] = []
        for name in CONTRACT_HEADERS:
            if rng.random() < 0.15:
                continue  # missing
            present.append((name, _value(rng, name, n)))
            if rng.random() < 0.08:
                present.append((name, _value(rng, name, n + 1)))  # duplicate: first wins
        present += [(f"x-app-{rng.randrange(3)}", b"other"), ("mq.stream ", b"not it"),
                    ("MQ.STREAM", b"case matters")][: rng.randrange(4)]
        rng.shuffle(present)
        kind = rng.random()
        headers = None if kind < 0.03 else [] if kind < 0.06 else present
        value = None if rng.random() < 0.1 else b"v" * rng.randrange(0, 50)
        key = None if rng.random() < 0.05 else f"T/{n % 7}".encode()
        ts = datetime.fromtimestamp(1_700_000_000 + n, tz=UTC).replace(tzinfo=None)
        rows.append((key, value, "mqgw.STREAM.A", n % 2, n, ts, 0, headers))
    return rows


def _decoded(spark: Any, monkeypatch: pytest.MonkeyPatch, lookup: Any,
             rows: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    with monkeypatch.context() as m:
        m.setattr(records, "header_bytes", lookup)
        frame = spark.createDataFrame(rows, KAFKA_SCHEMA)
        decoded = records.decode_records(frame)
        decoded = decoded.withColumn("violations", records.contract_violations(decoded))
        dead = records.decode_deadletters(frame)
        return (decoded.orderBy("offset").collect(), dead.orderBy("offset").collect())


def test_decode_matches_the_lambda_lookup_on_generated_records(
    spark_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = generated_rows(3_000)
    new_records, new_dead = _decoded(spark_session, monkeypatch, records.header_bytes, rows)
    old_records, old_dead = _decoded(spark_session, monkeypatch, lambda_header_bytes, rows)
    assert len(new_records) == len(old_records) == len(rows)
    for new, old in zip(new_records, old_records, strict=True):
        assert new == old, (new.asDict(), old.asDict())
    assert new_dead == old_dead
    # The generated set really covers the edge cases the comparison is about.
    assert any(r.headers is None for r in new_records)
    assert any(r.stream is None and r.headers for r in new_records)
    assert any(r.put_ms is None and r.headers for r in new_records)
    assert any(r.put_time is not None for r in new_records)
    assert any(r.violations and "duplicate_header" in r.violations for r in new_records)
    assert sum(1 for r in new_records if r.retain) > 0


def test_first_header_of_a_name_wins_and_absent_is_null(spark_session: Any) -> None:
    headers = [("mq.stream", b"FIRST"), ("mq.stream", b"SECOND"), ("mq.putTime", None),
               ("mq.ccsid", b" 1208 "), ("mq.encoding", b"1700000000000")]
    ts = datetime(2026, 1, 1)
    frame = spark_session.createDataFrame(
        [(b"k", b"v", "t", 0, 0, ts, 0, headers), (b"k", b"v", "t", 0, 1, ts, 0, None)],
        KAFKA_SCHEMA,
    )
    got = frame.orderBy("offset").select(
        records.header_text(c.H_STREAM).alias("stream"),
        records.header_bytes(c.H_PUT_TIME).alias("put"),
        records.header_long(c.H_CCSID).alias("ccsid"),
        records.header_text(c.H_TOPIC).alias("topic"),
    ).collect()
    assert [tuple(r) for r in got] == [("FIRST", None, 1208, None), (None, None, None, None)]
    # A number too large for an int column is null (a finding), not a failed query.
    decoded = records.decode_records(frame).orderBy("offset").select("encoding", "ccsid")
    assert [tuple(r) for r in decoded.collect()] == [(None, 1208), (None, None)]


def test_decode_plan_has_no_interpreted_lambda(spark_session: Any) -> None:
    """The traffic job's decoded columns compile without a higher-order function."""
    frame = spark_session.createDataFrame(generated_rows(10), KAFKA_SCHEMA)
    decoded = records.decode_records(frame).select(
        "stream", "topic", "key", "kafka_topic", "value_bytes", "event_time")
    plan = decoded._jdf.queryExecution().executedPlan().toString()
    assert "filter(" not in plan.lower() and "lambdafunction" not in plan.lower(), plan
    assert "array_position" in plan, plan
