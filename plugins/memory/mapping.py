"""Pure mapping between envelopes and the memory bus's records."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from gateway.plugin_api import Envelope


@dataclass(slots=True)
class Record:
    """What an outbound publication looks like on the bus (mirrors a Kafka record)."""

    stream: str
    topic: str
    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)
    retained: bool = False
    deleted: bool = False
    persistent: bool = False
    msg_id: bytes = b""
    #: when the publication entered MQ (milliseconds since the epoch; 0: unknown)
    put_time: int = 0


def record_of(envelope: Envelope) -> Record:
    e = envelope
    props = dict(e.properties)
    props.update((n, v) for n, v in e.name_value_pairs if n not in props)
    return Record(
        stream=e.stream,
        topic=e.topic,
        payload=e.payload,
        properties=props,
        retained=e.from_retained_store,
        deleted=e.delete,
        persistent=e.persistent,
        msg_id=e.msg_id,
        put_time=e.put_time_ms or 0,
    )


def record_json(record: Record) -> dict[str, object]:
    """A JSON-able form of ``record`` (payload as UTF-8 text, else base64)."""
    try:
        payload: dict[str, str] = {"payload": record.payload.decode("utf-8")}
    except UnicodeDecodeError:
        payload = {"payload_base64": base64.b64encode(record.payload).decode("ascii")}
    return {
        "stream": record.stream,
        "topic": record.topic,
        **payload,
        "properties": record.properties,
        "retained": record.retained,
        "deleted": record.deleted,
        "msg_id": record.msg_id.hex(),
    }
