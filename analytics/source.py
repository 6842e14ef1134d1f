"""Where a job reads from: the Kafka source of Structured Streaming with headers on.

``startingOffsets`` defaults to ``earliest`` (Spark's streaming default is ``latest``,
which would skip everything already bridged on a first run); later runs resume from
the checkpoint whatever this says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession

from analytics import AnalyticsError


class SourceConfigError(AnalyticsError):
    """The Kafka source options cannot work (no bootstrap, no topics, both kinds given)."""


@dataclass(frozen=True, slots=True)
class KafkaInput:
    """Which Kafka topics to read and how.

    Exactly one of ``topics`` (exact names) or ``pattern`` (a Java regex) is set.
    ``options`` are extra ``kafka.*`` or source options passed through unchanged.
    """

    bootstrap: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting_offsets: str = "earliest"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap.strip():
            raise SourceConfigError("no Kafka bootstrap servers given")
        if bool(self.topics) == (self.pattern is not None):
            raise SourceConfigError("give either topics or a pattern, not both or neither")
        if self.pattern is not None and not self.pattern:
            raise SourceConfigError("empty topic pattern")

    def source_options(self) -> dict[str, str]:
        """The option map of ``spark.readStream.format('kafka')``."""
        opts = {
            "kafka.bootstrap.servers": self.bootstrap,
            "includeHeaders": "true",
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
        }
        if self.topics:
            # subscribePattern, not subscribe: a subscribed topic that does not exist yet
            # must not be auto-created by the metadata request (e.g. mqgw-deadletter).
            opts["subscribePattern"] = "|".join(_java_quote(t) for t in self.topics)
        else:
            assert self.pattern is not None
            opts["subscribePattern"] = self.pattern
        if self.max_offsets_per_trigger is not None:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        opts.update(self.options)
        return opts

    def with_topics(self, topics: tuple[str, ...]) -> KafkaInput:
        """The same connection reading other exact topics (the dead-letter topic)."""
        return KafkaInput(
            bootstrap=self.bootstrap,
            topics=topics,
            starting_offsets=self.starting_offsets,
            fail_on_data_loss=self.fail_on_data_loss,
            max_offsets_per_trigger=self.max_offsets_per_trigger,
            options=dict(self.options),
        )


def _java_quote(topic: str) -> str:
    """A regex matching exactly ``topic`` (Kafka names hold only ``a-zA-Z0-9._-``)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
        raise SourceConfigError(f"not a valid Kafka topic name: {topic!r}")
    return topic.replace(".", r"\.")


def read_stream(spark: SparkSession, source: KafkaInput) -> DataFrame:
    """The streaming DataFrame of raw Kafka rows (key, value, headers, topic, ...)."""
    return spark.readStream.format("kafka").options(**source.source_options()).load()


def read_batch(spark: SparkSession, source: KafkaInput) -> DataFrame:
    """A batch read of everything in the topics now (for reports and the benchmark)."""
    opts = source.source_options()
    opts.pop("maxOffsetsPerTrigger", None)
    opts["endingOffsets"] = "latest"
    return spark.read.format("kafka").options(**opts).load()
