"""Decode the Kafka source's rows into typed bridged-record columns.

The Kafka source (``includeHeaders=true``) yields headers as
``array<struct<key:string,value:binary>>``; the contract puts numbers there as ASCII
decimal strings. Every conversion here is a ``try_`` form so one broken record becomes
nulls (and a quality finding) instead of failing the whole query under ANSI mode.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics import contract as c

# Largest millisecond value timestamp_millis accepts for year 9999 (anything above is junk).
_MAX_MILLIS = 253_402_300_799_999


def header_bytes(name: str, headers: str = "headers") -> Column:
    """The value of the first header called ``name`` as binary, null when absent.

    ``array_position`` over the header keys finds the first match and ``element_at``
    takes the value at that index: both are built-in expressions Spark compiles into
    the stage's generated code. (The former form, ``filter(headers, h -> h.key = name)``,
    is a higher-order function that Spark evaluates row by row in interpreted mode, once
    per header looked up; it was the largest cost of decoding, see docs/performance.md.)
    """
    column = F.col(headers)
    position = F.array_position(column["key"], F.lit(name)).cast("int")
    return F.when(position > 0, F.element_at(column["value"], position))


def header_text(name: str, headers: str = "headers") -> Column:
    """The value of header ``name`` decoded as UTF-8 text, null when absent."""
    return header_bytes(name, headers).cast("string")


def header_long(name: str, headers: str = "headers") -> Column:
    """Header ``name`` read as an ASCII decimal number; null when absent or not a number."""
    text = F.trim(header_text(name, headers))
    return F.when(text.rlike(r"^-?[0-9]{1,18}$"), text.try_cast("bigint"))


def millis_to_timestamp(millis: Column) -> Column:
    """Epoch milliseconds to a timestamp; null outside year 1970..9999 instead of an error."""
    return F.when(
        millis.between(F.lit(0), F.lit(_MAX_MILLIS)), F.timestamp_millis(millis)
    )


def utc_date(ts: Column) -> Column:
    """Calendar date in UTC whatever the session time zone (partition column ``date``)."""
    return F.date_from_unix_date(F.floor(F.unix_seconds(ts) / F.lit(86400)).cast("int"))


# Column order of decode_records' output (documented in docs/analytics.md).
RECORD_COLUMNS: tuple[str, ...] = (
    "kafka_topic", "partition", "offset", "kafka_time", "key", "value", "value_bytes",
    "tombstone", "contract", "stream", "topic", "msg_id", "correl_id", "put_ms", "put_time",
    "user_id", "format", "encoding", "ccsid", "persistence", "pub_header", "retain",
    "seq_num", "pub_time", "origin", "event_time", "headers",
)


def decode_records(kafka_rows: DataFrame) -> DataFrame:
    """Typed columns of the contract from raw Kafka source rows (stream or batch).

    ``event_time`` is the MQ put time when the record carries one, else the Kafka
    timestamp (tombstones carry no put time).
    """
    put_ms = header_long(c.H_PUT_TIME)
    put_time = millis_to_timestamp(put_ms)
    return kafka_rows.select(
        F.col("topic").alias("kafka_topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_time"),
        F.col("key").cast("string").alias("key"),
        F.col("value"),
        F.coalesce(F.length("value"), F.lit(0)).cast("bigint").alias("value_bytes"),
        F.col("value").isNull().alias("tombstone"),
        header_text(c.H_CONTRACT).alias("contract"),
        header_text(c.H_STREAM).alias("stream"),
        header_text(c.H_TOPIC).alias("topic"),
        header_bytes(c.H_MSG_ID).alias("msg_id"),
        header_bytes(c.H_CORREL_ID).alias("correl_id"),
        put_ms.alias("put_ms"),
        put_time.alias("put_time"),
        header_text(c.H_USER_ID).alias("user_id"),
        header_text(c.H_FORMAT).alias("format"),
        header_long(c.H_ENCODING).try_cast("int").alias("encoding"),
        header_long(c.H_CCSID).try_cast("int").alias("ccsid"),
        header_long(c.H_PERSISTENCE).try_cast("int").alias("persistence"),
        header_text(c.H_PUB_HEADER).alias("pub_header"),
        F.coalesce(header_text(c.H_RETAIN) == F.lit("1"), F.lit(False)).alias("retain"),
        header_long(c.H_SEQ_NUM).alias("seq_num"),
        header_text(c.H_PUB_TIME).alias("pub_time"),
        header_text(c.H_ORIGIN).alias("origin"),
        F.coalesce(put_time, F.col("timestamp")).alias("event_time"),
        F.col("headers"),
    )


def decode_deadletters(kafka_rows: DataFrame) -> DataFrame:
    """Typed columns of the optional dead-letter topic (contract: "Dead-letter records")."""
    put_time = millis_to_timestamp(header_long(c.H_PUT_TIME))
    return kafka_rows.select(
        F.col("topic").alias("kafka_topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_time"),
        F.col("key").cast("string").alias("queue"),
        F.coalesce(F.length("value"), F.lit(0)).cast("bigint").alias("value_bytes"),
        header_long(c.H_DLH_REASON).try_cast("int").alias("reason"),
        header_text(c.H_DLH_DEST_Q).alias("dest_q"),
        header_text(c.H_DLH_DEST_Q_MGR).alias("dest_q_mgr"),
        header_text(c.H_STREAM).alias("stream"),
        header_text(c.H_TOPIC).alias("topic"),
        header_bytes(c.H_MSG_ID).alias("msg_id"),
        F.coalesce(put_time, F.col("timestamp")).alias("event_time"),
    )


def contract_violations(records: DataFrame) -> Column:
    """``array<string>`` of the :data:`analytics.contract.CONTRACT_RULES` a record breaks."""
    value = ~F.col("tombstone")
    not_blank = F.length(F.trim(F.coalesce(F.col("stream"), F.lit("")))) > 0
    mq_keys = F.filter(F.col("headers"), lambda h: h["key"].startswith("mq."))
    distinct_mq = F.size(F.array_distinct(F.transform(mq_keys, lambda h: h["key"])))
    checks: dict[str, Column] = {
        "contract_version": F.coalesce(F.col("contract") != F.lit(c.CONTRACT_VERSION),
                                       F.lit(True)),
        "stream_missing": ~not_blank,
        "topic_missing": F.col("topic").isNull(),
        "key_mismatch": F.col("topic").isNotNull() & ~F.col("key").eqNullSafe(F.col("topic")),
        "origin_missing": F.length(F.trim(F.coalesce(F.col("origin"), F.lit("")))) == 0,
        "msg_id_invalid": value & F.coalesce(F.length("msg_id") != c.ID_LENGTH, F.lit(True)),
        "correl_id_invalid": value
        & F.coalesce(F.length("correl_id") != c.ID_LENGTH, F.lit(True)),
        "put_time_invalid": value & F.col("put_time").isNull(),
        "format_missing": value & F.col("format").isNull(),
        "encoding_invalid": value & F.col("encoding").isNull(),
        "ccsid_invalid": value & F.col("ccsid").isNull(),
        "persistence_invalid": value
        & ~F.coalesce(F.col("persistence").isin(0, 1), F.lit(False)),
        "pub_header_invalid": value
        & ~F.coalesce(F.col("pub_header").isin(*c.PUB_HEADERS), F.lit(False)),
        "duplicate_header": F.size(mq_keys) != distinct_mq,
    }
    names = [rule.name for rule in c.CONTRACT_RULES]
    assert set(names) == set(checks), "CONTRACT_RULES and the checks have drifted"
    flagged = F.array(*[F.when(checks[n], F.lit(n)) for n in names])
    return F.filter(flagged, lambda x: x.isNotNull())
