"""quality: duplicate MQ MsgIds, dead-lettered messages, and records breaking the contract.

Three queries:

- ``quality_duplicates``: MsgIds seen more than once per stream. The gateway is
  at-least-once into Kafka and a re-delivered publication keeps its MsgId *and* its put
  time, so grouping by (stream, MsgId, put-time window of ``dup_window``, default one
  hour) finds re-deliveries exactly while the state stays bounded by the watermark.
- ``quality_deadletter``: per window, reason code and destination, the records of the
  optional dead-letter topic (``mqgw-deadletter``).
- ``quality_violations``: per Kafka topic, window (Kafka timestamp: a broken record may
  have no usable put time) and rule, the records that break the header contract
  (rules: :data:`analytics.contract.CONTRACT_RULES`), with one example offset.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics import contract as c
from analytics.job import JobOptions, QueryPlan, show_batch
from analytics.records import contract_violations, decode_deadletters, decode_records, utc_date
from analytics.source import read_stream
from analytics.tables import ParquetTable

DUPLICATES_SCHEMA = StructType([
    StructField("msg_id_hex", StringType()),
    StructField("window_start", TimestampType()),
    StructField("copies", LongType()),
    StructField("topics", ArrayType(StringType())),
    StructField("first_offset", LongType()),
    StructField("last_offset", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

DEADLETTER_SCHEMA = StructType([
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("reason", IntegerType()),
    StructField("dest_q", StringType()),
    StructField("dest_q_mgr", StringType()),
    StructField("queue", StringType()),
    StructField("messages", LongType()),
    StructField("bytes", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

VIOLATIONS_SCHEMA = StructType([
    StructField("kafka_topic", StringType()),
    StructField("rule", StringType()),
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("records", LongType()),
    StructField("example_partition", IntegerType()),
    StructField("example_offset", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

DEFAULT_DUP_WINDOW = "1 hour"


def duplicates(records: DataFrame, options: JobOptions) -> DataFrame:
    """Streaming copies per (stream, MsgId, put-time window); the sink keeps copies > 1."""
    dup_window = options.extra.get("dup_window", DEFAULT_DUP_WINDOW)
    rows = records.where(~F.col("tombstone") & F.col("msg_id").isNotNull())
    grouped = rows.withWatermark("event_time", options.watermark).groupBy(
        F.window("event_time", dup_window).alias("w"), "stream", "msg_id"
    ).agg(
        F.count(F.lit(1)).alias("copies"),
        F.array_sort(F.collect_set(F.coalesce("topic", "key"))).alias("topics"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
    )
    return grouped.select(
        F.hex("msg_id").alias("msg_id_hex"), F.col("w.start").alias("window_start"),
        "copies", "topics", "first_offset", "last_offset", "stream",
        utc_date(F.col("w.start")).alias("date"),
    )


def deadletters(kafka_rows: DataFrame, options: JobOptions) -> DataFrame:
    """Streaming counts of dead-letter records per window, reason and destination."""
    rows = decode_deadletters(kafka_rows).withWatermark("event_time", options.watermark)
    grouped = rows.groupBy(
        F.window("event_time", options.window).alias("w"), "stream", "reason", "dest_q",
        "dest_q_mgr", "queue",
    ).agg(F.count(F.lit(1)).alias("messages"), F.sum("value_bytes").alias("bytes"))
    return grouped.select(
        F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        "reason", "dest_q", "dest_q_mgr", "queue", "messages", "bytes", "stream",
        utc_date(F.col("w.start")).alias("date"),
    )


def violations(records: DataFrame, options: JobOptions) -> DataFrame:
    """Streaming counts of contract violations per Kafka topic, rule and window."""
    rows = records.select(
        "kafka_topic", "partition", "offset", "stream", "kafka_time",
        F.explode(contract_violations(records)).alias("rule"),
    ).withWatermark("kafka_time", options.watermark)
    grouped = rows.groupBy(
        F.window("kafka_time", options.window).alias("w"), "kafka_topic", "stream", "rule"
    ).agg(
        F.count(F.lit(1)).alias("records"),
        F.min(F.struct("partition", "offset")).alias("example"),
    )
    return grouped.select(
        "kafka_topic", "rule", F.col("w.start").alias("window_start"),
        F.col("w.end").alias("window_end"), "records",
        F.col("example.partition").alias("example_partition"),
        F.col("example.offset").alias("example_offset"), "stream",
        utc_date(F.col("w.start")).alias("date"),
    )


def build(spark: SparkSession, options: JobOptions) -> list[QueryPlan]:
    """Duplicates and violations over the data topics; dead letters over their own topic."""
    dup_table = ParquetTable(options.table_path("quality_duplicates"), DUPLICATES_SCHEMA,
                             keys=("stream", "msg_id_hex", "window_start"))
    dl_table = ParquetTable(options.table_path("quality_deadletter"), DEADLETTER_SCHEMA,
                            keys=("stream", "window_start", "reason", "dest_q", "dest_q_mgr",
                                  "queue"))
    viol_table = ParquetTable(options.table_path("quality_violations"), VIOLATIONS_SCHEMA,
                              keys=("stream", "kafka_topic", "rule", "window_start"))

    def write_duplicates(batch: DataFrame, batch_id: int) -> None:
        found = batch.where(F.col("copies") > 1)
        dup_table.upsert(found)
        if options.console:
            show_batch(f"quality batch {batch_id}: duplicate MsgIds", found.drop("date"))

    def write_deadletters(batch: DataFrame, batch_id: int) -> None:
        dl_table.upsert(batch)
        if options.console:
            show_batch(f"quality batch {batch_id}: dead letters", batch.drop("date"))

    def write_violations(batch: DataFrame, batch_id: int) -> None:
        viol_table.upsert(batch)
        if options.console:
            show_batch(f"quality batch {batch_id}: contract violations", batch.drop("date"))

    records = decode_records(read_stream(spark, options.source))
    plans = [
        QueryPlan("quality_duplicates", duplicates(records, options), write_duplicates),
        QueryPlan("quality_violations", violations(records, options), write_violations),
    ]
    dl_topic = options.extra.get("deadletter_topic", c.DEADLETTER_TOPIC)
    if dl_topic:
        dl_rows = read_stream(spark, options.source.with_topics((dl_topic,)))
        plans.append(QueryPlan("quality_deadletter", deadletters(dl_rows, options),
                               write_deadletters))
    return plans
