"""Configuration of one ``memory`` plugin instance (the ``config:`` section)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class MemoryConfig(BaseModel):
    """An in-process bus, for tests, demos and trying a config without brokers.

    ``subscribe``: MQ topic filters (unified form, ``$SYS/STREAM/<stream>/...`` for a
    named stream, ``#`` and ``+`` wildcards) whose publications the instance receives.
    ``bus``: the name of the in-process bus it records to and takes inbound data from
    (instances naming the same bus share it).
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    subscribe: list[str] = Field(default_factory=list)
    """MQ topic filters in unified form (``$SYS/STREAM/<stream>/...`` for a named stream; ``#``,
    ``+``)."""
    bus: str = Field(default="default", min_length=1)
    """Name of the in-process bus; instances naming one bus share it."""
    record_file: Path | None = None
    """Also append every outbound record to this file as one JSON object per line
    (stream, topic, payload as text or base64, properties, retained, deleted): a way
    to see what a configuration would send without a broker."""
    refuse_larger_than: int | None = Field(default=None, ge=0)
    """Refuse for good (DeliveryRefusedError, reason MQRC_MSG_TOO_BIG_FOR_Q 2030) any
    outbound payload larger than this many bytes, as Kafka refuses a record over its
    ``max.request.size``: a way to try a sink's dead-letter path without a broker."""
    batch_size: int = Field(default=64, ge=1, le=5000)
    """Most inbound publications put in one MQ unit of work."""
