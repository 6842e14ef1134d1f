"""ohlc: 1-minute open/high/low/close/volume bars per symbol from STOCK.STREAM ticks.

A tick is one publication on the tick stream whose data (UTF-8) is either

- text ``SYMBOL PRICE [VOLUME]`` separated by blanks, e.g. ``IBM 131.25 300``, or
- a JSON object ``{"symbol": "IBM", "price": 131.25, "volume": 300}``.

Prices are ``decimal(18,6)`` (exact arithmetic, no float drift), volume an integer
(0 when left out). Open and close are the first and last tick of the minute by put
time, then Kafka partition and offset. Other publications (e.g. the bars themselves,
if the gateway bridges them back) do not parse and are ignored.

Each batch upserts the changed bars into ``ohlc`` (Parquet) and produces them to the
bars Kafka topic in the contract's shape, so the gateway publishes them to MQ and MQTT:
one record per changed bar, key and ``mq.topic`` ``OHLC/1m/<SYMBOL>`` (template
``bars_mq_topic``), ``mq.retain`` 1, the same ``mq.correlId`` for every version of a
bar and a fresh ``mq.msgId`` per version. The last version of a minute is its final bar.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from analytics import contract as c
from analytics.job import JobOptions, QueryPlan, show_batch
from analytics.records import decode_records, utc_date
from analytics.source import read_stream
from analytics.tables import ParquetTable

PRICE = DecimalType(18, 6)
TICK_JSON_SCHEMA = StructType([
    StructField("symbol", StringType()),
    StructField("price", PRICE),
    StructField("volume", LongType()),
])

BARS_SCHEMA = StructType([
    StructField("symbol", StringType()),
    StructField("window_start", TimestampType()),
    StructField("window_end", TimestampType()),
    StructField("open", PRICE),
    StructField("high", PRICE),
    StructField("low", PRICE),
    StructField("close", PRICE),
    StructField("volume", LongType()),
    StructField("ticks", LongType()),
    StructField("stream", StringType()),
    StructField("date", DateType()),
])

DEFAULT_STREAM = "STOCK.STREAM"
DEFAULT_BARS_TOPIC = "mqgw-analytics.ohlc"
DEFAULT_BARS_MQ_TOPIC = "OHLC/1m/{symbol}"
ORIGIN = "mqgw-analytics:ohlc"
_TEXT_TICK = r"^\s*(\S+)\s+([-+]?[0-9]+(?:\.[0-9]+)?)(?:\s+([0-9]+))?\s*$"


def parse_ticks(records: DataFrame, stream: str) -> DataFrame:
    """Ticks (symbol, price, volume, event_time, order) from the tick stream's records."""
    text = F.col("value").cast("string")
    is_json = F.ltrim(text).startswith("{")
    parsed = F.from_json(text, TICK_JSON_SCHEMA, {"mode": "PERMISSIVE"})
    matches = text.rlike(_TEXT_TICK)
    symbol = F.when(is_json, parsed["symbol"]).when(
        matches, F.regexp_extract(text, _TEXT_TICK, 1))
    price = F.when(is_json, parsed["price"]).when(
        matches, F.regexp_extract(text, _TEXT_TICK, 2).try_cast(PRICE))
    volume = F.when(is_json, F.coalesce(parsed["volume"], F.lit(0))).when(
        matches, F.coalesce(F.nullif(F.regexp_extract(text, _TEXT_TICK, 3), F.lit(""))
                            .try_cast("bigint"), F.lit(0)))
    ticks = records.where((F.col("stream") == F.lit(stream)) & ~F.col("tombstone")).select(
        "stream", "event_time",
        symbol.alias("symbol"), price.alias("price"), volume.cast("bigint").alias("volume"),
        F.struct("event_time", "partition", "offset").alias("order"),
    )
    return ticks.where(F.col("symbol").isNotNull() & (F.col("symbol") != "")
                       & F.col("price").isNotNull())


def bars(ticks: DataFrame, options: JobOptions) -> DataFrame:
    """Streaming bars per (stream, symbol, window)."""
    grouped = ticks.withWatermark("event_time", options.watermark).groupBy(
        F.window("event_time", options.window).alias("w"), "stream", "symbol"
    ).agg(
        F.min_by("price", "order").alias("open"),
        F.max("price").alias("high"),
        F.min("price").alias("low"),
        F.max_by("price", "order").alias("close"),
        F.sum("volume").alias("volume"),
        F.count(F.lit(1)).alias("ticks"),
    )
    return grouped.select(
        "symbol", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
        "open", "high", "low", "close", "volume", "ticks", "stream",
        utc_date(F.col("w.start")).alias("date"),
    )


def _decimal_text(col: str) -> Column:
    """A decimal as plain text without trailing zeros (``131.250000`` -> ``131.25``)."""
    return F.regexp_replace(F.regexp_replace(F.col(col).cast("string"), r"(\.\d*?)0+$", "$1"),
                            r"\.$", "")


def bar_records(bar_rows: DataFrame, options: JobOptions, batch_id: int) -> DataFrame:
    """Kafka records (key, value, headers) of changed bars in the contract's shape."""
    bars_stream = options.extra.get("bars_stream", DEFAULT_STREAM)
    template = options.extra.get("bars_mq_topic", DEFAULT_BARS_MQ_TOPIC)
    prefix, _, suffix = template.partition("{symbol}")
    mq_topic = F.concat(F.lit(prefix), F.col("symbol"), F.lit(suffix))
    start_ms = F.unix_millis("window_start").cast("string")
    bar_id = F.concat_ws("|", F.lit(bars_stream), F.col("symbol"), start_ms)
    correl = F.unhex(F.substring(F.sha2(bar_id, 256), 1, 2 * c.ID_LENGTH))
    msg = F.unhex(F.substring(
        F.sha2(F.concat_ws("|", bar_id, F.lit(str(batch_id))), 256), 1, 2 * c.ID_LENGTH))
    value = F.to_json(F.struct(
        F.col("symbol"),
        F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("start"),
        F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("end"),
        _decimal_text("open").alias("open"), _decimal_text("high").alias("high"),
        _decimal_text("low").alias("low"), _decimal_text("close").alias("close"),
        F.col("volume"), F.col("ticks"),
    ))

    def h(name: str, val: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), val.cast("binary").alias("value"))

    headers = F.array(
        h(c.H_CONTRACT, F.lit(c.CONTRACT_VERSION)),
        h(c.H_STREAM, F.lit(bars_stream)),
        h(c.H_TOPIC, mq_topic),
        h(c.H_MSG_ID, msg),
        h(c.H_CORREL_ID, correl),
        h(c.H_PUT_TIME, F.unix_millis(F.current_timestamp()).cast("string")),
        h(c.H_FORMAT, F.lit("MQSTR")),
        h(c.H_ENCODING, F.lit("546")),
        h(c.H_CCSID, F.lit("1208")),
        h(c.H_PERSISTENCE, F.lit("0")),
        h(c.H_PUB_HEADER, F.lit("MQRFH2")),
        h(c.H_RETAIN, F.lit("1")),
        h(c.H_ORIGIN, F.lit(ORIGIN)),
        h(c.USR_PREFIX + "Symbol", F.col("symbol")),
    )
    return bar_rows.select(mq_topic.cast("binary").alias("key"),
                           value.cast("binary").alias("value"), headers.alias("headers"))


def build(spark: SparkSession, options: JobOptions) -> list[QueryPlan]:
    """One query: bars upserted to Parquet and produced to the bars topic each batch."""
    stream = options.extra.get("stream", DEFAULT_STREAM)
    bars_topic = options.extra.get("bars_topic", DEFAULT_BARS_TOPIC)
    table = ParquetTable(options.table_path("ohlc"), BARS_SCHEMA,
                         keys=("stream", "symbol", "window_start"))

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        table.upsert(batch)
        if bars_topic:
            (bar_records(batch, options, batch_id).write.format("kafka")
             .option("kafka.bootstrap.servers", options.source.bootstrap)
             .option("topic", bars_topic).save())
        if options.console:
            show_batch(f"ohlc batch {batch_id}",
                       batch.drop("date").orderBy("symbol", "window_start"))

    records = decode_records(read_stream(spark, options.source))
    return [QueryPlan("ohlc", bars(parse_ticks(records, stream), options), write_batch)]
