"""The broker ``batch_size`` settings the bridge benchmarks run (``--batch-sizes``).

A number sets ``batch_size``; ``default`` gives none, so the run measures the broker's
default configuration as a user who tunes nothing has it (issue 32).
"""

from __future__ import annotations

from gateway.runtime.pubsub_service import BrokerConfig, StreamQueueConfig

__all__ = ["DEFAULT", "batch_label", "broker_config", "parse_batch_sizes"]

#: The ``--batch-sizes`` word for the default configuration.
DEFAULT = "default"


def parse_batch_sizes(text: str) -> list[int | None]:
    """``--batch-sizes``: numbers, or ``default`` (None: the broker's default setting)."""
    return [None if b.strip() == DEFAULT else int(b) for b in text.split(",") if b.strip()]


def batch_label(batch: int | None) -> str:
    """How a printed line and a summary row name a batch setting."""
    return "default configuration" if batch is None else f"batch {batch}"


def broker_config(stream: str, batch: int | None, wait_ms: int) -> BrokerConfig:
    """The benchmarks' broker settings: ``batch`` None keeps the default ``batch_size``."""
    config = BrokerConfig(streams=[StreamQueueConfig(name=stream)], wait_ms=wait_ms)
    return config if batch is None else config.model_copy(update={"batch_size": batch})
