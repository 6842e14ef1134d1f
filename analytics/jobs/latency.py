"""latency: MQ put time -> Kafka timestamp, as a histogram and percentiles per window.

Latency is ``kafka timestamp - mq.putTime`` in milliseconds. Percentiles come from a
histogram whose buckets keep two significant digits (1 ms wide below 100 ms, 10 ms below
1 s, 100 ms below 10 s, ...): a bucket is at most 10 % wide, histograms of micro-batches
add up exactly, and a reported percentile is the upper bound of the bucket holding the
nearest-rank value (so it is within one bucket of the exact value, and never above max).
Negative latencies (clocks apart) are counted in bucket 0 and in ``negative``.

A second query counts per (stream, topic, window) the records that arrived
*out of order* (put time earlier than an earlier offset of the same key on the same
partition, across batches) and *late* (latency above ``late_after_ms``). Its rows are
per micro-batch (``batch_id`` in the key) so a replayed batch overwrites itself; sum over
``batch_id`` to read it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
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
from analytics.tables import ParquetTable, delete_path, path_exists, rows_of_groups

HISTOGRAM_SCHEMA = StructType([
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("bucket_ms", LongType()),
    StructField("records", LongType()),
    StructField("max_ms", LongType()),
    StructField("min_ms", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

LATENCY_SCHEMA = StructType([
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("records", LongType()),
    StructField("negative", LongType()),
    StructField("p50_ms", LongType()),
    StructField("p95_ms", LongType()),
    StructField("p99_ms", LongType()),
    StructField("max_ms", LongType()),
    StructField("min_ms", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

ORDER_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("batch_id", LongType()),
    StructField("records", LongType()),
    StructField("out_of_order", LongType()),
    StructField("late", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

ORDER_STATE_SCHEMA = StructType([
    StructField("kafka_topic", StringType()),
    StructField("partition", LongType()),
    StructField("key", StringType()),
    StructField("max_put_ms", LongType()),
    StructField("batch_id", LongType()),
])

DEFAULT_LATE_AFTER_MS = 60_000
PERCENTILES = (("p50_ms", 50), ("p95_ms", 95), ("p99_ms", 99))


def bucket_upper_bound(latency_ms: Column) -> Column:
    """Upper bound of the two-significant-digit bucket holding ``latency_ms`` (0 for <= 0)."""
    digits = F.length(latency_ms.cast("string"))
    unit = F.pow(F.lit(10), F.greatest(digits - 2, F.lit(0))).cast("bigint")
    rounded = ((latency_ms + unit - 1) / unit).cast("bigint") * unit
    return F.when(latency_ms <= 0, F.lit(0).cast("bigint")).otherwise(rounded)


def bucket_upper_bound_py(latency_ms: int) -> int:
    """The same bucket rule in Python (tests and docs use it)."""
    if latency_ms <= 0:
        return 0
    unit = 10 ** max(len(str(latency_ms)) - 2, 0)
    rounded: int = -(-latency_ms // unit) * unit
    return rounded


def with_latency(records: DataFrame) -> DataFrame:
    """Records that carry a put time, with ``latency_ms``."""
    return records.where(~F.col("tombstone") & F.col("put_ms").isNotNull()).withColumn(
        "latency_ms", F.unix_millis("kafka_time") - F.col("put_ms")
    )


def histogram(records: DataFrame, options: JobOptions) -> DataFrame:
    """Streaming histogram per (stream, window, bucket)."""
    rows = with_latency(records).withWatermark("event_time", options.watermark)
    grouped = rows.groupBy(
        F.window("event_time", options.window).alias("w"),
        F.col("stream"),
        bucket_upper_bound(F.col("latency_ms")).alias("bucket_ms"),
    ).agg(
        F.count(F.lit(1)).alias("records"),
        F.max("latency_ms").alias("max_ms"),
        F.min("latency_ms").alias("min_ms"),
    )
    return grouped.select(
        F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        "bucket_ms", "records", "max_ms", "min_ms", "stream",
        utc_date(F.col("w.start")).alias("date"),
    )


def percentiles(hist: DataFrame) -> DataFrame:
    """Percentiles per (stream, window) from histogram rows (nearest rank, bucket bound)."""
    group = ["stream", "date", "window_start", "window_end"]
    cum = Window.partitionBy(*group).orderBy("bucket_ms").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    total = Window.partitionBy(*group)
    ranked = hist.withColumn("cum", F.sum("records").over(cum)).withColumn(
        "total", F.sum("records").over(total))
    aggs = [
        F.sum("records").alias("records"),
        F.sum(F.when(F.col("min_ms") < 0, F.col("records")).otherwise(0)).alias("negative"),
        F.max("max_ms").alias("max_ms"),
        F.min("min_ms").alias("min_ms"),
    ]
    for name, pct in PERCENTILES:
        rank = F.ceil(F.col("total") * F.lit(pct) / F.lit(100))
        aggs.append(F.min(F.when(F.col("cum") >= rank, F.col("bucket_ms"))).alias(name))
    out = ranked.groupBy(*group).agg(*aggs)
    for name, _ in PERCENTILES:
        out = out.withColumn(name, F.least(F.col(name), F.greatest(F.col("max_ms"), F.lit(0))))
    return out


def _order_rows(batch: DataFrame, state: DataFrame, options: JobOptions,
                batch_id: int) -> tuple[DataFrame, DataFrame]:
    """Out-of-order and late counts of one batch, and the order state after it."""
    late_after = int(options.extra.get("late_after_ms", DEFAULT_LATE_AFTER_MS))
    rows = with_latency(batch).select(
        "kafka_topic", F.col("partition").cast("bigint").alias("partition"), "key", "offset",
        "put_ms", "stream", F.coalesce("topic", "key").alias("topic"), "event_time",
        "latency_ms",
    )
    joined = rows.join(F.broadcast(state.drop("batch_id")),
                       on=["kafka_topic", "partition", "key"], how="left")
    earlier = Window.partitionBy("kafka_topic", "partition", "key").orderBy("offset") \
        .rowsBetween(Window.unboundedPreceding, -1)
    flagged = joined.withColumn(
        "seen_max", F.greatest(F.max("put_ms").over(earlier), F.col("max_put_ms"))
    ).withColumn("ooo", F.coalesce(F.col("put_ms") < F.col("seen_max"), F.lit(False)))
    counts = flagged.groupBy(F.window("event_time", options.window).alias("w"), "stream",
                             "topic").agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.col("ooo").cast("bigint")).alias("out_of_order"),
        F.sum((F.col("latency_ms") > late_after).cast("bigint")).alias("late"),
    ).select(
        "topic", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        F.lit(batch_id).cast("bigint").alias("batch_id"), "records", "out_of_order", "late",
        "stream", utc_date(F.col("w.start")).alias("date"),
    )
    new_state = (
        rows.groupBy("kafka_topic", "partition", "key").agg(F.max("put_ms").alias("max_put_ms"))
        .unionByName(state.drop("batch_id"))
        .groupBy("kafka_topic", "partition", "key").agg(F.max("max_put_ms").alias("max_put_ms"))
        .withColumn("batch_id", F.lit(batch_id).cast("bigint"))
    )
    return counts, new_state


def build(spark: SparkSession, options: JobOptions) -> list[QueryPlan]:
    """Two queries: the latency histogram/percentiles and the order/late counts."""
    hist_table = ParquetTable(options.table_path("latency_histogram"), HISTOGRAM_SCHEMA,
                              keys=("stream", "window_start", "bucket_ms"))
    lat_table = ParquetTable(options.table_path("latency"), LATENCY_SCHEMA,
                             keys=("stream", "window_start"))
    order_table = ParquetTable(options.table_path("latency_order"), ORDER_SCHEMA,
                               keys=("stream", "topic", "window_start", "batch_id"))
    state_path = options.extra.get("state_path") or options.table_path("_latency_order_state")

    def write_histogram(batch: DataFrame, batch_id: int) -> None:
        merged = hist_table.upsert(batch)
        summary = percentiles(rows_of_groups(merged, batch, ("stream", "window_start")))
        lat_table.upsert(summary)
        if options.console:
            show_batch(f"latency batch {batch_id}",
                       summary.drop("date").orderBy("stream", "window_start"))

    def write_order(batch: DataFrame, batch_id: int) -> None:
        # State of the previous batch, never this one's: a replayed batch recomputes the
        # same counts from the same starting point.
        state = spark.createDataFrame([], ORDER_STATE_SCHEMA)
        if path_exists(spark, state_path):
            stored = spark.read.schema(ORDER_STATE_SCHEMA).parquet(state_path)
            prev = stored.where(F.col("batch_id") < batch_id).agg(F.max("batch_id")).first()
            if prev is not None and prev[0] is not None:
                state = stored.where(F.col("batch_id") == prev[0]).localCheckpoint()
        counts, new_state = _order_rows(batch, state, options, batch_id)
        order_table.upsert(counts)
        (new_state.write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
         .partitionBy("batch_id").parquet(state_path))
        for old in range(max(batch_id - 10, 0), batch_id - 1):
            delete_path(spark, f"{state_path}/batch_id={old}")
        if options.console:
            show_batch(f"latency order batch {batch_id}", counts.drop("date"))

    records = decode_records(read_stream(spark, options.source))
    return [
        QueryPlan("latency", histogram(records, options), write_histogram),
        QueryPlan("latency_order", records, write_order, output_mode="append"),
    ]
