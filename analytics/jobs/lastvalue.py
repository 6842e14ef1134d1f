"""lastvalue: the latest publication per (stream, topic), honouring retained deletes.

Reads the compacted retained topics (``mqgw-retained.*`` by default). Within one Kafka
topic a key always lands on one partition, so the highest offset per key is the latest
publication; a tombstone (null value) there deletes the row from the table. The table
is partitioned by ``stream`` only: a topic's row would otherwise move between date
partitions as it is republished. A tombstone without ``mq.stream`` (e.g. written by a
compaction tool) takes its stream from the escaped Kafka topic name and its topic from
the key.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics import contract as c
from analytics.job import JobOptions, QueryPlan, show_batch
from analytics.records import decode_records
from analytics.source import read_stream
from analytics.tables import ParquetTable

LASTVALUE_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("value", BinaryType()),
    StructField("value_text", StringType()),
    StructField("format", StringType()),
    StructField("encoding", IntegerType()),
    StructField("ccsid", IntegerType()),
    StructField("msg_id_hex", StringType()),
    StructField("put_time", TimestampType()),
    StructField("retain", BooleanType()),
    StructField("kafka_topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("kafka_time", TimestampType()),
    StructField("stream", StringType()),
])

_LATEST_FIELDS = ("value", "tombstone", "format", "encoding", "ccsid", "msg_id", "put_time",
                  "retain", "partition", "offset", "kafka_time")


def stream_from_topic_name(kafka_topic: Column) -> Column:
    """Unescape ``<prefix>.<escaped stream>`` (the contract's ``_XX`` escape) in Spark SQL.

    ``_`` only ever starts an escape and ``%``/``+`` never appear unescaped, so turning
    ``_`` into ``%`` and URL-decoding is exact; a malformed name gives null.
    """
    escaped = F.regexp_extract(kafka_topic, r"^[^.]+\.(.+)$", 1)
    decoded = F.try_url_decode(F.replace(escaped, F.lit("_"), F.lit("%")))
    return F.when(escaped != "", decoded)


def latest(records: DataFrame) -> DataFrame:
    """Streaming: the latest record per (kafka_topic, stream, topic), tombstones included."""
    keyed = records.select(
        "kafka_topic",
        F.coalesce(F.col("stream"), stream_from_topic_name(F.col("kafka_topic"))).alias("stream"),
        F.coalesce(F.col("topic"), F.col("key")).alias("topic"),
        F.struct(*_LATEST_FIELDS).alias("rec"),
        "offset",
    )
    grouped = keyed.groupBy("kafka_topic", "stream", "topic").agg(
        F.max_by("rec", "offset").alias("rec")
    )
    return grouped.select(
        "topic",
        F.col("rec.value").alias("value"),
        F.col("rec.value").cast("string").alias("value_text"),
        F.col("rec.format").alias("format"),
        F.col("rec.encoding").alias("encoding"),
        F.col("rec.ccsid").alias("ccsid"),
        F.hex("rec.msg_id").alias("msg_id_hex"),
        F.col("rec.put_time").alias("put_time"),
        F.col("rec.retain").alias("retain"),
        "kafka_topic",
        F.col("rec.partition").alias("partition"),
        F.col("rec.offset").alias("offset"),
        F.col("rec.kafka_time").alias("kafka_time"),
        "stream",
        F.col("rec.tombstone").alias("deleted"),
    )


def build(spark: SparkSession, options: JobOptions) -> list[QueryPlan]:
    """One query; each batch upserts changed topics and removes deleted ones."""
    table = ParquetTable(options.table_path("lastvalue"), LASTVALUE_SCHEMA,
                         keys=("stream", "kafka_topic", "topic"), partition_by=("stream",))

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        merged = table.upsert(batch, deleted="deleted")
        if options.console:
            show_batch(f"lastvalue batch {batch_id}",
                       merged.select("stream", "topic", "value_text", "put_time")
                       .orderBy("stream", "topic"))

    records = decode_records(read_stream(spark, options.source))
    return [QueryPlan("lastvalue", latest(records), write_batch)]


DEFAULT_PATTERN = c.RETAINED_PREFIX.replace(".", r"\.") + ".*"
