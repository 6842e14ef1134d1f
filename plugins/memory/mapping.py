"""Pure mapping between engine deliveries and the memory bus's records."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from gateway.plugin_api import DEFAULT_STREAM, Delivery
from gateway.wire.folder import parse_folder

_PREFIX = "$SYS/STREAM/"


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
    put_time: str = ""


def topic_in_stream(stream: str, topic: str) -> str:
    """The delivery's topic without its ``$SYS/STREAM/<stream>/`` prefix."""
    prefix = f"{_PREFIX}{stream}/"
    if stream != DEFAULT_STREAM and topic.startswith(prefix):
        return topic[len(prefix) :]
    return topic


def usr_properties(folders: list[str]) -> dict[str, str]:
    """The flat ``usr`` folder elements of a publication's extra MQRFH2 folders."""
    out: dict[str, str] = {}
    for text in folders:
        if text.startswith("<usr"):
            folder = parse_folder(text)
            out.update((c.name, c.text) for c in folder.children if not c.children)
    return out


def record_of(delivery: Delivery) -> Record:
    pub = delivery.publication
    props = usr_properties(pub.extra_folders)
    props.update((n, v) for n, v in pub.user_pairs if n not in props)
    return Record(
        stream=pub.stream,
        topic=topic_in_stream(pub.stream, delivery.topic),
        payload=delivery.body,
        properties=props,
        retained=delivery.retained,
        deleted=delivery.deleted,
        persistent=delivery.md.persistence == 1,
        msg_id=delivery.md.msg_id,
        put_time=delivery.md.put_date + delivery.md.put_time,
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
