"""Parquet output tables that a streaming job keeps current, one row per key.

Streaming aggregations run in *update* mode: each micro-batch carries the full current
value of every group it changed. A Parquet sink in Spark only appends, so writing those
rows as they come would leave several versions of a window behind. ``ParquetTable``
merges them instead: read the partitions the batch touches, replace the rows whose key
came again, and overwrite just those partitions (dynamic partition overwrite). Because
each row holds an absolute value, replaying a batch after a crash writes the same table.

Only the touched partitions' directories are read (never the whole table's listing),
and a batch whose partitions do not exist yet (a table's first write) is written as it
comes: nothing to read, nothing to replace. A table derived wholly from another one's
partitions (a summary) can skip the merge: :meth:`ParquetTable.replace_partitions`.

Hadoop's FileSystem (through the JVM) does the listing and deleting so paths on HDFS or
object stores work the same as local ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, StructType


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm: Any = spark._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = jpath.getFileSystem(spark._jsc.hadoopConfiguration())
    return fs, jpath


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists on its file system."""
    fs, jpath = _hadoop_path(spark, path)
    return bool(fs.exists(jpath))


def delete_path(spark: SparkSession, path: str) -> None:
    """Delete ``path`` recursively if it exists."""
    fs, jpath = _hadoop_path(spark, path)
    if fs.exists(jpath):
        fs.delete(jpath, True)


def partition_dir(spark: SparkSession, column: str, value: object) -> str:
    """The directory name Spark gives partition ``column=value`` (its own escaping).

    Spark writes a null *or empty* value to the default partition (and reads it back as
    null), so ``""`` maps there like ``None``. ``str(value)`` is Spark's own text for the
    string and date values a :class:`ParquetTable` allows as partition columns."""
    jvm: Any = spark._jvm
    utils = jvm.org.apache.spark.sql.catalyst.catalog.ExternalCatalogUtils
    text = ("__HIVE_DEFAULT_PARTITION__" if value is None or value == ""
            else utils.escapePathName(str(value)))
    return f"{utils.escapePathName(column)}={text}"


def _key_match(left: DataFrame, right: DataFrame, keys: tuple[str, ...]) -> Column:
    conds = [left[k].eqNullSafe(right[k]) for k in keys]
    return reduce(lambda a, b: a & b, conds)


def rows_of_groups(rows: DataFrame, groups: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """``rows`` whose ``keys`` appear in ``groups`` (null-safe: a null stream matches)."""
    wanted = groups.select(*keys).distinct()
    return rows.join(F.broadcast(wanted), _key_match(rows, wanted, keys), "left_semi")


class Merge(NamedTuple):
    """What :meth:`ParquetTable.merge` did: the rows of every touched partition, and
    the touched partitions that did not exist before the batch (written as they came)."""

    rows: DataFrame
    created: list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class ParquetTable:
    """A Parquet table at ``path``, unique on ``keys``, partitioned by ``partition_by``.

    ``schema`` is the table's explicit schema (partition columns included); existing
    files are read with it, never inferred.
    """

    path: str
    schema: StructType
    keys: tuple[str, ...]
    partition_by: tuple[str, ...] = ("stream", "date")

    def __post_init__(self) -> None:
        # Whether a partition exists is decided from the path text (``partition_dir``),
        # which matches Spark's for string and date values only.
        for c in self.partition_by:
            kind = self.schema[c].dataType
            if not isinstance(kind, (StringType, DateType)):
                raise TypeError(f"partition column {c} must be a string or a date, not {kind}")

    def read(self, spark: SparkSession) -> DataFrame:
        """The table now (empty with the right schema when nothing was written yet)."""
        if not path_exists(spark, self.path):
            return spark.createDataFrame([], self.schema)
        return spark.read.schema(self.schema).parquet(self.path)

    def upsert(self, updates: DataFrame, deleted: str | None = None) -> DataFrame:
        """Merge ``updates`` (one row per key) into the table and return the merged rows.

        Rows whose boolean column ``deleted`` is true remove their key instead of being
        written (retained-publication tombstones). The returned DataFrame holds every
        row of the partitions touched, for follow-up summaries: checkpointed when existing
        partitions were merged, but on a first write (no touched partition existed) it is
        ``updates``' own rows, recomputed on each use - cheap only while the caller keeps
        ``updates`` cached (the runner persists every micro-batch).
        """
        merged = self.upsert_changed(updates, deleted)
        if merged is None:
            return updates.sparkSession.createDataFrame([], self.schema)
        return merged

    def upsert_changed(self, updates: DataFrame, deleted: str | None = None) -> DataFrame | None:
        """:meth:`upsert`, but None when ``updates`` touched no partition (an empty
        micro-batch), so a caller can skip follow-up work without another Spark job.

        When none of the touched partitions exists yet, the rows returned are not
        materialised: they are ``updates``' own (minus deletes), recomputed on use.
        """
        done = self.merge(updates, deleted)
        return None if done is None else done.rows

    def merge(self, updates: DataFrame, deleted: str | None = None) -> Merge | None:
        """:meth:`upsert_changed`, also telling which touched partitions were new.

        An empty string partition value is taken as null first: Spark writes both to
        the default partition and reads it back as null, so a blank stream name and a
        missing one are the same partition and the same keys.
        """
        spark = updates.sparkSession
        columns = [f.name for f in self.schema.fields]
        blank_to_null = [
            F.when(F.col(c) != "", F.col(c)).alias(c)
            if c in self.partition_by and isinstance(self.schema[c].dataType, StringType)
            else F.col(c)
            for c in columns
        ]
        incoming = updates.select(*blank_to_null, *([deleted] if deleted else []))
        # Cached, not checkpointed: the collect below materialises it (no job of its
        # own), and the merged rows are checkpointed before any file is overwritten.
        # A micro-batch the runner already cached is not cached a second time.
        own_cache = not updates.is_cached
        if own_cache:
            incoming = incoming.persist()
        try:
            touched = [tuple(r) for r in
                       incoming.select(*self.partition_by).distinct().collect()]
            if not touched:
                return None
            fresh = (incoming.where(~F.col(deleted)) if deleted else incoming).select(*columns)
            exists = {v: path_exists(spark, self._partition_path(spark, v)) for v in touched}
            present = [self._partition_path(spark, v) for v in touched if exists[v]]
            created = [v for v in touched if not exists[v]]
            if not present:
                # First write of these partitions: no rows to keep or to delete.
                self._write(fresh)
                return Merge(fresh, created)
            existing = (spark.read.schema(self.schema).option("basePath", self.path)
                        .parquet(*present))
            kept = existing.join(incoming, _key_match(existing, incoming, self.keys),
                                 "left_anti")
            merged = kept.select(*columns).unionByName(fresh).localCheckpoint()
            self._write(merged)
            if deleted:
                self._drop_emptied(spark, touched, merged)
            return Merge(merged, created)
        finally:
            if own_cache:
                incoming.unpersist()

    def replace_partitions(self, rows: DataFrame) -> None:
        """Overwrite the partitions ``rows`` fall in with ``rows`` (no read, no merge).

        For a table recomputed whole per partition from another table's merged
        partitions (``traffic_streams`` from ``traffic_topics``): ``rows`` must hold
        every row of each partition it touches. Other partitions stay as they are.
        """
        self._write(rows.select(*[f.name for f in self.schema.fields]))

    def exists(self, spark: SparkSession, values: tuple[Any, ...]) -> bool:
        """Whether the partition ``values`` (in ``partition_by`` order) has a directory."""
        return path_exists(spark, self._partition_path(spark, values))

    def _write(self, rows: DataFrame) -> None:
        (
            rows.write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .partitionBy(*self.partition_by)
            .parquet(self.path)
        )

    def _partition_path(self, spark: SparkSession, values: tuple[Any, ...]) -> str:
        parts = [partition_dir(spark, c, v) for c, v in zip(self.partition_by, values,
                                                                strict=True)]
        return "/".join([self.path.rstrip("/"), *parts])

    def _drop_emptied(self, spark: SparkSession, touched: list[tuple[Any, ...]],
                      merged: DataFrame) -> None:
        """Dynamic overwrite leaves a partition alone when no row is written to it: when
        deletes emptied a partition, remove its directory so the deleted rows go too."""
        remaining = {tuple(r) for r in merged.select(*self.partition_by).distinct().collect()}
        for values in touched:
            if values not in remaining:
                delete_path(spark, self._partition_path(spark, values))
