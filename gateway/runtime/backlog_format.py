"""The message a sink delivery is while it waits on its sink's backlog queue (sans-I/O).

Each sink has a backlog queue (``SYSTEM.MQGW.SINK.<instance>``), the gateway's
transmission queue towards that sink: the publish/subscribe service puts every delivery
for the sink onto it in the unit of work of the publication, and the sink's forwarder
gets it from there (``gateway.runtime.pubsub_service.sink_forwarder``). The envelope is
encoded once, so the plugin sees exactly what it would have seen directly.

Format (version 1), MQMD Format ``MQGWENV1``, documented in docs/operations.md::

    b"MQGWENV1"   8 bytes, magic and version
    length        4 bytes, big-endian: size of the header that follows
    header        UTF-8 JSON object: every Envelope field but ``payload`` (bytes as hex)
    payload       the rest of the message, as is

An unknown magic, a header that does not parse or a field of the wrong type raises
:class:`BacklogFormatError` (reason MQRC_FORMAT_ERROR for the MQDLH).

The forwarder runs in the process that put the delivery, so it normally does not decode
at all: :class:`EnvelopeCache` keeps each envelope by the MsgId its backlog message was
put with (:func:`backlog_msg_id`), and only a miss (after a restart, an eviction, a
message put by someone else) decodes the message. The message on the queue stays the
durable copy; the cache is an optimisation that never decides what is delivered.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from gateway.plugin_api import Envelope
from gateway.wire.reasons import Reason

__all__ = [
    "BACKLOG_FORMAT",
    "BACKLOG_QUEUE_PREFIX",
    "BacklogFormatError",
    "EnvelopeCache",
    "backlog_msg_id",
    "backlog_queue_name",
    "decode_backlog_message",
    "encode_backlog_message",
]

#: MQMD Format of a backlog message (8 characters, as MQ format names are).
BACKLOG_FORMAT = "MQGWENV1"
_MAGIC = BACKLOG_FORMAT.encode("ascii")
_LENGTH = struct.Struct(">I")
#: A sink's backlog queue is this prefix and the instance name (``backlog_queue_name``).
BACKLOG_QUEUE_PREFIX = "SYSTEM.MQGW.SINK."
_MQ_NAME = re.compile(r"^[A-Za-z0-9._/%]{1,48}$")

_BYTES_FIELDS = frozenset({"correl_id", "msg_id", "correlation_data"})
_MAP_FIELDS = frozenset({"properties", "property_types"})
#: tuples of (name, value) string pairs
_PAIR_FIELDS = frozenset({"name_value_pairs", "property_list"})
_FIELDS = {f.name: f for f in fields(Envelope)}


class BacklogFormatError(ValueError):
    """A backlog message cannot be decoded; ``reason`` goes into its MQDLH."""

    reason = Reason.FORMAT_ERROR


def backlog_queue_name(instance: str) -> str:
    """The backlog queue of plugin instance ``instance``.

    Instance names allow ``-``, MQ names do not: it becomes ``%`` (which instance names
    never contain, so two instances never share a queue). A name too long for MQ's 48
    characters raises ValueError (config validation names the instance).
    """
    name = BACKLOG_QUEUE_PREFIX + instance.replace("-", "%")
    if not _MQ_NAME.match(name):
        raise ValueError(
            f"plugin instance {instance!r}: its backlog queue name {name!r} is not a valid "
            f"MQ queue name (at most {48 - len(BACKLOG_QUEUE_PREFIX)} characters)"
        )
    return name


#: (field name, how it is written) for every Envelope field but the payload, in the
#: dataclass's order: 0 as is, 1 bytes as hex, 2 a mapping as [key, value] lists, 3 a
#: sequence of pairs as lists
_HEADER_FIELDS: tuple[tuple[str, int], ...] = tuple(
    (name, 1 if name in _BYTES_FIELDS else 2 if name in _MAP_FIELDS
     else 3 if name in _PAIR_FIELDS else 0)
    for name in _FIELDS
    if name != "payload"
)
#: json.dumps(..., separators=(",", ":"), ensure_ascii=False) without making an encoder
#: per call (same text)
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


#: every header field's value of an envelope, in ``_HEADER_FIELDS`` order, in one call
_HEADER_VALUES = operator.attrgetter(*(name for name, _ in _HEADER_FIELDS))


def encode_backlog_message(envelope: Envelope) -> bytes:
    """The backlog message body of ``envelope`` (see module docstring)."""
    header: dict[str, Any] = {}
    for (name, kind), value in zip(_HEADER_FIELDS, _HEADER_VALUES(envelope), strict=True):
        if kind:
            if kind == 1:
                value = value.hex()
            elif kind == 2:
                value = [[k, v] for k, v in value.items()]
            else:
                value = [list(p) for p in value]
        header[name] = value
    raw = _JSON(header).encode("utf-8")
    return b"".join((_MAGIC, _LENGTH.pack(len(raw)), raw, envelope.payload))


def _pairs(value: object, name: str) -> list[tuple[str, str]]:
    if not isinstance(value, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in value
    ):
        raise BacklogFormatError(f"backlog message field {name!r} is not a list of pairs")
    return [(p[0], p[1]) for p in value]


def decode_backlog_message(body: bytes) -> Envelope:
    """The envelope a backlog message carries; BacklogFormatError when it is not one."""
    head = len(_MAGIC) + _LENGTH.size
    if len(body) < head or body[: len(_MAGIC)] != _MAGIC:
        raise BacklogFormatError("not a backlog message (no MQGWENV1 header)")
    (size,) = _LENGTH.unpack_from(body, len(_MAGIC))
    if head + size > len(body):
        raise BacklogFormatError("backlog message header longer than the message")
    try:
        header = json.loads(body[head : head + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BacklogFormatError(f"backlog message header does not parse: {exc}") from exc
    if not isinstance(header, dict):
        raise BacklogFormatError("backlog message header is not an object")
    values: dict[str, Any] = {"payload": body[head + size :]}
    for name, value in header.items():
        if name not in _FIELDS or name == "payload":
            continue  # a later version's field: ignored (the version says what must be)
        try:
            if name in _BYTES_FIELDS:
                value = bytes.fromhex(value)
            elif name in _MAP_FIELDS:
                value = dict(_pairs(value, name))
            elif name in _PAIR_FIELDS:
                value = tuple(_pairs(value, name))
        except (TypeError, ValueError) as exc:
            raise BacklogFormatError(f"backlog message field {name!r}: {exc}") from exc
        values[name] = value
    for required in ("stream", "topic"):
        if not isinstance(values.get(required), str):
            raise BacklogFormatError(f"backlog message has no {required!r}")
    return Envelope(**values)


#: MsgIds of backlog messages: "MQGW", the process id (4 bytes), 4 random bytes per
#: process and a 12-byte counter. Unique in this process; the pid keeps two live
#: processes of one host apart, the random part restarts and other hosts. Both are drawn
#: again in a child made by ``os.fork`` (it would otherwise repeat its parent's ids).
_ID_PREFIX = b""
_ID_COUNTER = itertools.count(1)


def _seed_msg_ids() -> None:
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX = b"MQGW" + (os.getpid() & 0xFFFFFFFF).to_bytes(4, "big") + os.urandom(4)
    _ID_COUNTER = itertools.count(1)


_seed_msg_ids()
os.register_at_fork(after_in_child=_seed_msg_ids)


def backlog_msg_id() -> bytes:
    """A fresh 24-byte MsgId for a backlog message (the key of :class:`EnvelopeCache`)."""
    return _ID_PREFIX + next(_ID_COUNTER).to_bytes(12, "big")


class EnvelopeCache:
    """The envelopes of backlog messages put by this process, by MsgId (bounded).

    ``put`` when the backlog put is made, ``take`` when the forwarder got the message
    (a miss, or an entry whose body differs, is None: decode the message),
    ``discard`` once the forwarder's unit of work committed. Entries of a unit of work
    that was backed out before the commit stay until evicted: past ``max_entries`` or
    ``max_bytes`` (payload bytes) the oldest go first. Single-threaded (one event loop).
    """

    __slots__ = ("_bytes", "_entries", "hits", "max_bytes", "max_entries", "misses")

    def __init__(self, max_entries: int = 8192, max_bytes: int = 64 * 1024 * 1024) -> None:
        #: msg_id -> (the message body put, its envelope). The body is the queued
        #: message's own bytes object (no copy while it is queued); a hit needs an equal
        #: body (``is`` first, else length then memcmp), so an entry can never stand in
        #: for another message that came with the same MsgId: an equal body decodes to
        #: an equal envelope.
        self._entries: dict[bytes, tuple[bytes, Envelope]] = {}
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, msg_id: bytes, body: bytes, envelope: Envelope) -> None:
        """Remember ``envelope`` as the content of the backlog message ``msg_id``, whose
        body is ``body`` (its encoding)."""
        size = len(envelope.payload)
        if self.max_entries <= 0 or size > self.max_bytes:
            return
        old = self._entries.pop(msg_id, None)
        if old is not None:
            self._bytes -= len(old[1].payload)
        entries = self._entries
        while entries and (len(entries) >= self.max_entries or self._bytes + size > self.max_bytes):
            oldest = next(iter(entries))
            self._bytes -= len(entries.pop(oldest)[1].payload)
        entries[msg_id] = (body, envelope)
        self._bytes += size

    def take(self, msg_id: bytes, body: bytes) -> Envelope | None:
        """The envelope of the backlog message ``msg_id`` got with ``body``, or None
        (decode it). The entry stays until :meth:`discard` (a backout gets it again)."""
        entry = self._entries.get(msg_id)
        if entry is None or (entry[0] is not body and entry[0] != body):
            self.misses += 1
            return None
        self.hits += 1
        return entry[1]

    def discard(self, msg_ids: Iterable[bytes]) -> None:
        """Forget the messages whose get was committed."""
        entries = self._entries
        for msg_id in msg_ids:
            old = entries.pop(msg_id, None)
            if old is not None:
                self._bytes -= len(old[1].payload)
