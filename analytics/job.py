"""What a job is: options in, streaming queries out.

A job builds one or more :class:`QueryPlan` (a streaming DataFrame plus the function that
writes each micro-batch); the runner starts them with a checkpoint each and a trigger
(``availableNow`` for ``--once``, a processing-time interval otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from analytics import AnalyticsError
from analytics.source import KafkaInput

BatchWriter = Callable[[DataFrame, int], None]


class JobConfigError(AnalyticsError):
    """A job option that cannot work (bad window, unknown job)."""


@dataclass(frozen=True, slots=True)
class JobOptions:
    """Options every job shares, plus ``extra`` for the job's own (see each job module)."""

    source: KafkaInput
    out: str
    window: str = "1 minute"
    watermark: str = "10 minutes"
    console: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def table_path(self, name: str) -> str:
        """Where output table ``name`` lives under ``out``."""
        return f"{self.out.rstrip('/')}/{name}"


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """One streaming query of a job: ``frame`` is written by ``write_batch`` per batch."""

    name: str
    frame: DataFrame
    write_batch: BatchWriter
    output_mode: str = "update"


JobBuilder = Callable[[SparkSession, JobOptions], list[QueryPlan]]


def show_batch(title: str, frame: DataFrame, rows: int = 20) -> None:
    """Console output for humans (``--console``): a heading and the first rows."""
    print(f"--- {title}", flush=True)
    frame.show(rows, truncate=False)
