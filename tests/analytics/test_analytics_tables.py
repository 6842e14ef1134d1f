"""The table paths of ``ParquetTable`` write exactly what the former merge wrote.

``upsert_changed`` now reads only the touched partitions' directories, writes a batch
whose partitions do not exist yet directly (no read, no anti-join, no checkpoint), and
caches the incoming rows instead of checkpointing them; the traffic job computes its
streams table from the topics table's merged rows in one pass
(``ParquetTable.replace_partitions``) instead of a second merge. Each is run here next
to the former code (kept below, verbatim in behaviour, as the reference) over generated
batches - first writes, updates of existing keys, new keys in existing partitions, new
partitions, a null and a blank partition value, deletes that empty a partition, deletes
of absent keys, empty batches - and every table must hold the same rows after every batch.
The reference builds its own partition paths and reads (nothing shared with the code
under test but Spark); further tests compare with a plain Python model instead.
"""

from __future__ import annotations

import random
import shutil
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from analytics.jobs import traffic
from analytics.tables import ParquetTable, _key_match, rows_of_groups


def _ref_dir(spark: SparkSession, column: str, value: object) -> str:
    """The reference's own partition directory name (Spark's escaping, its default
    partition for null; blanks are nulled before this is used)."""
    utils = spark._jvm.org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils
    text = "__HIVE_DEFAULT_PARTITION__" if value is None else utils.escapePathName(str(value))
    return f"{column}={text}"


def _ref_read(spark: SparkSession, table: ParquetTable) -> DataFrame:
    if not Path(table.path).exists():
        return spark.createDataFrame([], table.schema)
    return spark.read.schema(table.schema).parquet(table.path)

# -- the former code (reference) ---------------------------------------------------------


def old_upsert(table: ParquetTable, updates: DataFrame, deleted: str | None = None
               ) -> DataFrame | None:
    """``ParquetTable.upsert_changed`` as it was (whole-table read, semi-join on the
    touched partitions, anti-join, two localCheckpoints, every time), its null-partition
    bug fixed and blank partition values taken as null (Spark stores them as null)."""
    spark = updates.sparkSession
    columns = [f.name for f in table.schema.fields]
    nulled = [F.when(F.col(c) != "", F.col(c)).alias(c) if c in table.partition_by
              and isinstance(table.schema[c].dataType, StringType) else F.col(c)
              for c in columns]
    incoming = updates.select(*nulled, *([deleted] if deleted else [])).localCheckpoint()
    touched = [tuple(r) for r in incoming.select(*table.partition_by).distinct().collect()]
    if not touched:
        return None
    touched_df = spark.createDataFrame(
        touched, StructType([table.schema[c] for c in table.partition_by])
    )
    # The one change: the former semi-join was ``on=list(partition_by)``, an equi-join
    # that never matches a null partition value, so every batch touching the null-stream
    # partition dropped that partition's untouched rows (see the test below).
    current = _ref_read(spark, table)
    existing = current.join(F.broadcast(touched_df),
                            _key_match(current, touched_df, table.partition_by), "left_semi")
    kept = existing.join(incoming, _key_match(existing, incoming, table.keys), "left_anti")
    fresh = incoming.where(~F.col(deleted)) if deleted else incoming
    merged = kept.select(*columns).unionByName(fresh.select(*columns)).localCheckpoint()
    (
        merged.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy(*table.partition_by)
        .parquet(table.path)
    )
    if deleted:
        # The former ``_drop_emptied``: a partition the deletes emptied loses its dir.
        remaining = {tuple(r) for r in merged.select(*table.partition_by).distinct().collect()}
        for values in touched:
            if values not in remaining:
                parts = [_ref_dir(spark, c, v) for c, v in zip(table.partition_by, values,
                                                                 strict=True)]
                shutil.rmtree(Path(table.path, *parts), ignore_errors=True)
    return merged


def old_traffic_batch(batch: DataFrame, topics: ParquetTable, streams: ParquetTable,
                      top: int) -> None:
    """The traffic writer as it was: two merges per batch."""
    merged = old_upsert(topics, batch)
    if merged is None:
        return
    # The batch's blank stream is the stored null one (as in ``old_upsert``).
    groups = batch.withColumn("stream", F.when(F.col("stream") != "", F.col("stream")))
    affected = rows_of_groups(merged, groups, ("stream", "window_start"))
    old_upsert(streams, traffic.summarise_streams(affected, top))


# -- generated data ----------------------------------------------------------------------

DAY = date(2026, 11, 25)
STREAMS = ["S.A", "S.B", "S/odd name=1", None, ""]


def topic_batch(rng: random.Random, n: int, days: int) -> list[tuple[Any, ...]]:
    """``n`` distinct traffic_topics keys with arbitrary counts (one row per key, as an
    update-mode micro-batch gives), over ``days`` days and a few windows each."""
    rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    while len(rows) < n:
        stream = rng.choice(STREAMS)
        day = DAY + timedelta(days=rng.randrange(days))
        start = datetime(day.year, day.month, day.day) + timedelta(minutes=rng.randrange(6))
        topic = f"T/{rng.randrange(8)}"
        key = (stream or None, topic, start)  # "" and None: one key once stored
        rows[key] = (f"mqgw.{stream}", topic, start, start + timedelta(minutes=1),
                     rng.randrange(1, 5), rng.randrange(0, 400), stream, day)
    return list(rows.values())


def table_rows(spark: SparkSession, table: ParquetTable) -> list[tuple[Any, ...]]:
    """Every row of the table, in a canonical order (arrays of structs included)."""
    rows = [tuple(r) for r in table.read(spark).collect()]
    return sorted(rows, key=repr)


def _tables(root: Path) -> tuple[ParquetTable, ParquetTable]:
    return (
        ParquetTable(str(root / "traffic_topics"), traffic.TOPICS_SCHEMA,
                     keys=("stream", "kafka_topic", "topic", "window_start")),
        ParquetTable(str(root / "traffic_streams"), traffic.STREAMS_SCHEMA,
                     keys=("stream", "window_start")),
    )


def _jobs_of(spark: SparkSession, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_traffic_single_pass_writes_what_two_merges_wrote(
    spark_session: Any, tmp_path: Path
) -> None:
    rng = random.Random(16)
    old_topics, old_streams = _tables(tmp_path / "old")
    new_topics, new_streams = _tables(tmp_path / "new")
    # First write (1 day), an empty batch, updates + new windows + a new day, a batch of
    # existing partitions only, and one mixing existing and new partitions.
    batches = [topic_batch(rng, 60, 1), [], topic_batch(rng, 80, 2), topic_batch(rng, 40, 1),
               topic_batch(rng, 120, 3)]
    sc = spark_session.sparkContext
    old_jobs = new_jobs = 0
    for i, rows in enumerate(batches):
        batch = spark_session.createDataFrame(rows, traffic.TOPICS_SCHEMA).persist()
        try:
            sc.setJobGroup(f"old-{i}", "reference")
            old_traffic_batch(batch, old_topics, old_streams, 3)
            sc.setJobGroup(f"new-{i}", "single pass")
            summary = traffic.write_tables(batch, new_topics, new_streams, 3)
            sc.setJobGroup("check", "compare")
        finally:
            batch.unpersist()
        old_jobs += _jobs_of(spark_session, f"old-{i}")
        new_jobs += _jobs_of(spark_session, f"new-{i}")
        assert (summary is None) == (not rows)
        assert table_rows(spark_session, new_topics) == table_rows(spark_session, old_topics), i
        assert table_rows(spark_session, new_streams) == table_rows(spark_session,
                                                                    old_streams), i
    streams = table_rows(spark_session, new_streams)
    # Every stream (the null one too) and day has its summary; totals add up.
    assert {(r[6], r[7]) for r in streams} == {
        (r[6], r[7]) for r in table_rows(spark_session, new_topics)}
    assert sum(r[2] for r in streams) == sum(
        r[4] for r in table_rows(spark_session, new_topics))
    # The top list is the 3 largest of the window's topic rows (a real bound: some
    # windows have more than 3 topics).
    topics_rows = table_rows(spark_session, new_topics)
    assert any(r[4] > 3 for r in streams)
    for r in streams:
        mine = [t for t in topics_rows if (t[6], t[2]) == (r[6], r[0])]
        assert len(r[5]) == min(3, len(mine))
        assert sorted(t[2] for t in r[5]) == sorted(t[4] for t in mine)[::-1][:len(r[5])][::-1]
    assert new_jobs < old_jobs, (new_jobs, old_jobs)


KV_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("value", LongType()),
    StructField("stream", StringType()),
])
KV_UPDATES = StructType([*KV_SCHEMA.fields, StructField("deleted", BooleanType())])


def kv_batch(rng: random.Random, n: int, delete_share: float) -> list[tuple[Any, ...]]:
    rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for _ in range(n):
        stream, topic = rng.choice(STREAMS), f"K/{rng.randrange(12)}"
        rows[(stream or None, topic)] = (topic, rng.randrange(1000), stream,
                                 rng.random() < delete_share)
    return list(rows.values())


def test_upsert_with_deletes_matches_the_former_merge(spark_session: Any, tmp_path: Path
                                                      ) -> None:
    rng = random.Random(17)
    old = ParquetTable(str(tmp_path / "old"), KV_SCHEMA, keys=("stream", "topic"),
                       partition_by=("stream",))
    new = ParquetTable(str(tmp_path / "new"), KV_SCHEMA, keys=("stream", "topic"),
                       partition_by=("stream",))
    stream_a = [("K/1", 1, "S.A", True), ("K/2", 2, "S.A", False)]
    # First write with deletes of absent keys; then random mixes; a batch that deletes
    # every key of stream S.A (its partition directory must go); one deleting nothing.
    batches = [stream_a, kv_batch(rng, 30, 0.2), kv_batch(rng, 30, 0.5),
               [("K/2", 0, "S.A", True)] + [(f"K/{i}", 0, "S.A", True) for i in range(12)
                                             if i != 2],
               kv_batch(rng, 20, 0.0), []]
    for i, rows in enumerate(batches):
        batch = spark_session.createDataFrame(rows, KV_UPDATES)
        old_merged = old_upsert(old, batch, deleted="deleted")
        new_merged = new.upsert_changed(batch, deleted="deleted")
        assert (old_merged is None) == (new_merged is None), i
        if old_merged is not None and new_merged is not None:
            assert sorted(map(tuple, new_merged.collect()), key=repr) == sorted(
                map(tuple, old_merged.collect()), key=repr), i
        assert table_rows(spark_session, new) == table_rows(spark_session, old), i
        assert sorted(p.name for p in Path(new.path).glob("stream=*")) == sorted(
            p.name for p in Path(old.path).glob("stream=*")), i
        if i == 3:
            assert not (Path(new.path) / "stream=S.A").exists()


def test_first_write_returns_the_rows_written_without_reading(
    spark_session: Any, tmp_path: Path
) -> None:
    table = ParquetTable(str(tmp_path / "t"), KV_SCHEMA, keys=("stream", "topic"),
                         partition_by=("stream",))
    rows = [("K/1", 1, "S.A", False), ("K/2", 2, None, False), ("K/3", 3, "S.B", True)]
    sc = spark_session.sparkContext
    sc.setJobGroup("first", "first write")
    merged = table.upsert_changed(spark_session.createDataFrame(rows, KV_UPDATES),
                                  deleted="deleted")
    first_jobs = _jobs_of(spark_session, "first")
    sc.setJobGroup("check", "compare")
    assert merged is not None
    assert sorted(map(tuple, merged.collect()), key=repr) == sorted(
        [("K/1", 1, "S.A"), ("K/2", 2, None)], key=repr)
    assert table_rows(spark_session, table) == sorted(
        [("K/1", 1, "S.A"), ("K/2", 2, None)], key=repr)
    # Fewer Spark jobs than the former first write (nothing read, nothing checkpointed).
    reference = ParquetTable(str(tmp_path / "ref"), KV_SCHEMA, keys=("stream", "topic"),
                             partition_by=("stream",))
    sc.setJobGroup("reference", "former first write")
    old_upsert(reference, spark_session.createDataFrame(rows, KV_UPDATES), deleted="deleted")
    sc.setJobGroup("check", "compare")
    assert first_jobs < _jobs_of(spark_session, "reference"), first_jobs
    assert table_rows(spark_session, reference) == table_rows(spark_session, table)
    sc.setJobGroup("second", "merge")
    merged_again = table.upsert_changed(spark_session.createDataFrame([("K/1", 5, "S.A", False)],
                                                       KV_UPDATES), deleted="deleted")
    sc.setJobGroup("check", "compare")
    # The merge path returns every row of the touched partition (here the one key),
    # and the untouched null partition stays (checked next).
    assert merged_again is not None
    assert sorted(map(tuple, merged_again.collect()), key=repr) == [("K/1", 5, "S.A")]
    assert table_rows(spark_session, table) == sorted(
        [("K/1", 5, "S.A"), ("K/2", 2, None)], key=repr)


def test_untouched_rows_of_the_null_partition_are_kept(spark_session: Any, tmp_path: Path
                                                       ) -> None:
    """The former merge lost them (its partition semi-join was not null-safe)."""
    table = ParquetTable(str(tmp_path / "t"), KV_SCHEMA, keys=("stream", "topic"),
                         partition_by=("stream",))
    for rows in ([("K/1", 1, None, False), ("K/2", 2, None, False)],
                 [("K/2", 3, None, False), ("K/3", 4, None, False)]):
        table.upsert_changed(spark_session.createDataFrame(rows, KV_UPDATES),
                             deleted="deleted")
    assert table_rows(spark_session, table) == [("K/1", 1, None), ("K/2", 3, None),
                                                ("K/3", 4, None)]


# -- an independent reference: a plain Python model of the table -------------------------
# The tests above compare with the former Spark merge; these compare with a dict keyed
# like the table, so a path or escaping bug shared by both Spark paths cannot hide.
# A blank stream is the null stream (Spark writes both to the default partition).

ODD_STREAMS = ["S.A", "", None, "S%25{x},y:z", "S}b"]


def _norm(stream: Any) -> Any:
    return None if stream == "" else stream


def model_topics(model: dict[tuple[Any, ...], tuple[Any, ...]],
                 rows: list[tuple[Any, ...]]) -> None:
    for r in rows:
        row = (*r[:6], _norm(r[6]), r[7])
        model[(row[6], row[0], row[1], row[2])] = row


def expected_streams(spark: SparkSession, model: dict[tuple[Any, ...], tuple[Any, ...]],
                     top: int) -> list[tuple[Any, ...]]:
    frame = spark.createDataFrame(list(model.values()), traffic.TOPICS_SCHEMA)
    summary = traffic.summarise_streams(frame, top).select(
        *[f.name for f in traffic.STREAMS_SCHEMA.fields])
    return sorted((tuple(r) for r in summary.collect()), key=repr)


def odd_batch(rng: random.Random, n: int, days: list[int]) -> list[tuple[Any, ...]]:
    rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    while len(rows) < n:
        stream = rng.choice(ODD_STREAMS)
        day = DAY + timedelta(days=rng.choice(days))
        start = datetime(day.year, day.month, day.day) + timedelta(minutes=rng.randrange(6))
        topic = f"T/{rng.randrange(8)}"
        # One row per normalised key, as one update-mode micro-batch gives.
        key = (_norm(stream), topic, start)
        rows[key] = (f"mqgw.{_norm(stream)}", topic, start, start + timedelta(minutes=1),
                     rng.randrange(1, 5), rng.randrange(0, 400), stream, day)
    return list(rows.values())


def test_traffic_tables_match_a_python_model(spark_session: Any, tmp_path: Path) -> None:
    """Blank and null streams mixed, odd stream names, a new-day-only batch onto an
    existing table (first-write path while other partitions exist), replays."""
    rng = random.Random(18)
    topics, streams = _tables(tmp_path)
    model: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    batches = [odd_batch(rng, 50, [0]), odd_batch(rng, 40, [0]), odd_batch(rng, 30, [1]),
               [], odd_batch(rng, 60, [0, 1]), odd_batch(rng, 20, [2]),
               [(f"mqgw.{None}", "T/1", datetime(2026, 11, 25), datetime(2026, 11, 25, 0, 1),
                 9, 9, "", DAY)]]
    for i, rows in enumerate(batches):
        batch = spark_session.createDataFrame(rows, traffic.TOPICS_SCHEMA).persist()
        try:
            summary = traffic.write_tables(batch, topics, streams, 3)
        finally:
            batch.unpersist()
        assert (summary is None) == (not rows), i
        model_topics(model, rows)
        assert table_rows(spark_session, topics) == sorted(model.values(), key=repr), i
        assert table_rows(spark_session, streams) == expected_streams(spark_session, model,
                                                                      3), i
    assert not list(Path(topics.path).glob("stream=/*"))  # "" never gets its own dir


def test_lost_topics_partition_keeps_the_other_stream_windows(
    spark_session: Any, tmp_path: Path
) -> None:
    """Tables that already disagree: a traffic_topics partition gone (crash inside its
    commit, or removed by hand) while its traffic_streams partition is intact. The next
    batch must not recompute the streams partition from the incomplete topics rows."""
    topics, streams = _tables(tmp_path)
    t0 = datetime(2026, 11, 25)
    first = [("mqgw.S.A", "T/1", t0 + timedelta(minutes=m), t0 + timedelta(minutes=m + 1),
              2, 20, "S.A", DAY) for m in range(3)]
    traffic.write_tables(spark_session.createDataFrame(first, traffic.TOPICS_SCHEMA),
                         topics, streams, 3)
    shutil.rmtree(Path(topics.path) / "stream=S.A")
    late = [("mqgw.S.A", "T/2", t0, t0 + timedelta(minutes=1), 5, 50, "S.A", DAY)]
    traffic.write_tables(spark_session.createDataFrame(late, traffic.TOPICS_SCHEMA),
                         topics, streams, 3)
    got = {(r[0], r[2]) for r in table_rows(spark_session, streams)}
    # Window 0 merged from what topics holds now; windows 1 and 2 kept as they were.
    assert got == {(t0, 5), (t0 + timedelta(minutes=1), 2), (t0 + timedelta(minutes=2), 2)}


def test_blank_stream_upserts_and_deletes_like_null(spark_session: Any, tmp_path: Path
                                                    ) -> None:
    """lastvalue's shape (partitioned by stream only): a blank-stream batch neither
    overwrites nor duplicates the null partition, and its tombstones delete."""
    table = ParquetTable(str(tmp_path / "t"), KV_SCHEMA, keys=("stream", "topic"),
                         partition_by=("stream",))
    rng = random.Random(19)
    model: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    batches = [[("K/1", 1, None, False), ("K/2", 2, None, False)],
               [("K/3", 3, "", False)],                       # blank only: first-write risk
               [("K/2", 4, "", False), ("K/4", 5, "S%{,}:", False)],
               [("K/1", 0, "", True)],                        # tombstone, blank stream
               *[kv_batch_odd(rng, 25, 0.3) for _ in range(3)]]
    for i, rows in enumerate(batches):
        table.upsert_changed(spark_session.createDataFrame(rows, KV_UPDATES),
                             deleted="deleted")
        for topic, value, stream, gone in rows:
            if gone:
                model.pop((_norm(stream), topic), None)
            else:
                model[(_norm(stream), topic)] = (topic, value, _norm(stream))
        assert table_rows(spark_session, table) == sorted(model.values(), key=repr), i
        if i == 3:
            assert ("K/1", 1, None) not in table_rows(spark_session, table)


def kv_batch_odd(rng: random.Random, n: int, delete_share: float) -> list[tuple[Any, ...]]:
    rows: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for _ in range(n):
        stream, topic = rng.choice(ODD_STREAMS), f"K/{rng.randrange(10)}"
        rows[(_norm(stream), topic)] = (topic, rng.randrange(1000), stream,
                                        rng.random() < delete_share)
    return list(rows.values())


def test_partition_columns_must_be_strings_or_dates() -> None:
    schema = StructType([StructField("k", StringType()), StructField("flag", BooleanType())])
    try:
        ParquetTable("unused", schema, keys=("k",), partition_by=("flag",))
    except TypeError:
        return
    raise AssertionError("a boolean partition column was accepted")
