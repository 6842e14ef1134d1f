"""traffic: messages and bytes per stream and topic per window, and top topics per stream.

Event time is the MQ put time (the Kafka timestamp for records without one); the
watermark bounds how long a window stays open for late records. Bytes are the record
value's length (the publication data as published; 0 for a tombstone).

Tables (docs/analytics.md): ``traffic_topics`` one row per (stream, kafka_topic, topic,
window); ``traffic_streams`` one row per (stream, window) with the top topics.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics.job import JobOptions, QueryPlan, show_batch
from analytics.records import decode_records, utc_date
from analytics.source import read_stream
from analytics.tables import ParquetTable, rows_of_groups

TOPICS_SCHEMA = StructType([
    StructField("kafka_topic", StringType()),
    StructField("topic", StringType()),
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("messages", LongType()),
    StructField("bytes", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

TOP_TOPIC = StructType([
    StructField("topic", StringType()),
    StructField("kafka_topic", StringType()),
    StructField("messages", LongType()),
    StructField("bytes", LongType()),
])

STREAMS_SCHEMA = StructType([
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("messages", LongType()),
    StructField("bytes", LongType()),
    StructField("topics", LongType()),
    StructField("top_topics", ArrayType(TOP_TOPIC)),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

DEFAULT_TOP = 10


def aggregate(records: DataFrame, options: JobOptions) -> DataFrame:
    """Per (stream, kafka_topic, topic, window) counts from decoded records."""
    grouped = (
        records.withWatermark("event_time", options.watermark)
        .groupBy(
            F.window("event_time", options.window).alias("w"),
            F.col("stream"),
            F.col("kafka_topic"),
            F.coalesce(F.col("topic"), F.col("key")).alias("topic"),
        )
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("value_bytes").alias("bytes"))
    )
    return grouped.select(
        "kafka_topic", "topic",
        F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        "messages", "bytes", "stream", utc_date(F.col("w.start")).alias("date"),
    )


def summarise_streams(topic_rows: DataFrame, top: int) -> DataFrame:
    """Per (stream, window) totals and the ``top`` topics by messages, then bytes, then name."""
    entry = F.struct("topic", "kafka_topic", "messages", "bytes")
    ranked = F.array_sort(
        F.collect_list(entry),
        lambda a, b: F.when(a["messages"] != b["messages"],
                            F.when(a["messages"] > b["messages"], -1).otherwise(1))
        .when(a["bytes"] != b["bytes"], F.when(a["bytes"] > b["bytes"], -1).otherwise(1))
        .when(a["topic"] < b["topic"], -1)
        .when(a["topic"] > b["topic"], 1)
        .otherwise(0),
    )
    return topic_rows.groupBy("stream", "date", "window_start", "window_end").agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.count(F.lit(1)).alias("topics"),
        F.slice(ranked, 1, top).cast(ArrayType(TOP_TOPIC)).alias("top_topics"),
    )


def write_tables(batch: DataFrame, topics_table: ParquetTable, streams_table: ParquetTable,
                 top: int) -> DataFrame | None:
    """Merge one micro-batch of topic rows into both tables; the streams rows written
    (every window of the touched partitions), or None for a batch that changed nothing."""
    done = topics_table.merge(batch)
    if done is None:
        # Nothing changed (the no-data batch ``availableNow`` runs to move the
        # watermark): the streams table would merge nothing, skip its Spark jobs.
        return None
    # ``done.rows`` holds every topic row of the (stream, date) partitions the batch
    # touched, and a streams row is a function of its window's topic rows only: the
    # streams partitions are recomputed from it and overwritten, one pass, no merge.
    summary = summarise_streams(done.rows, top)
    spark = batch.sparkSession
    if any(streams_table.exists(spark, p) for p in done.created):
        # A topics partition that did not exist while its streams partition does (lost
        # in a crash inside the topics commit, deleted or restored by hand): the topics
        # rows are incomplete, so merge as before instead of recomputing the streams
        # partition from them, which would drop the windows this batch did not touch.
        streams_table.upsert_changed(summary)
    else:
        streams_table.replace_partitions(summary)
    return summary


def build(spark: SparkSession, options: JobOptions) -> list[QueryPlan]:
    """The traffic query: windowed counts upserted into ``traffic_topics`` each batch,
    ``traffic_streams`` recomputed from its merged partitions."""
    top = int(options.extra.get("top", DEFAULT_TOP))
    topics_table = ParquetTable(options.table_path("traffic_topics"), TOPICS_SCHEMA,
                                keys=("stream", "kafka_topic", "topic", "window_start"))
    streams_table = ParquetTable(options.table_path("traffic_streams"), STREAMS_SCHEMA,
                                 keys=("stream", "window_start"))

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        summary = write_tables(batch, topics_table, streams_table, top)
        if summary is not None and options.console:
            show_batch(f"traffic batch {batch_id}: streams",
                       rows_of_groups(summary, batch, ("stream", "window_start"))
                       .drop("date").orderBy("stream", "window_start"))

    frame = aggregate(decode_records(read_stream(spark, options.source)), options)
    return [QueryPlan("traffic", frame, write_batch)]
