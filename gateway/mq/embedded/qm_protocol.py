"""The local client protocol of the embedded queue manager: frames, sans-I/O.

Why: a running ``mqgw run`` owns its queue manager's data directory, so administration
(``mqgw qm``) and separate legacy applications reach the queue manager the way an MQ
application with a local binding does: through the process that owns it. The server
(:mod:`.qm_server`) listens on a Unix socket in the data directory; the client
(:mod:`.client`) gives a :class:`gateway.mq.port.Connection` over it.

A frame is ``!I`` total length, ``!I`` header length, a UTF-8 JSON object (the request
or reply: ``op``, its arguments, ``ok``/``reason``), then binary data (a packed MQMD
version 2 in native encoding followed by the message body, for put and get; for
``get_batch`` several of those back to back, their sizes in the reply's ``lengths``).

Asynchronous put (MQPMO_ASYNC_RESPONSE): ``put_async`` and ``put1_async`` are ``put`` and
``put1`` with **no reply**. The server handles a connection's frames in order, so they
keep their order with the calls around them; it keeps the connection's MQSTAT record
(first failure, success/warning/failure counts), returned and reset by ``async_status``,
and a unit of work in which an asynchronous syncpoint put failed cannot commit: ``commit``
backs it out and replies 2003 (MQRC_BACKED_OUT, completion code warning) naming the
failure (the gateway's rule, not IBM's: IBM MQ's MQCMIT commits the puts that
succeeded). A client may write several such frames (and the call that follows) in one
write, and sends them only to a server whose ``connect`` reply lists ``put_async`` in
``features`` (:data:`FEATURES`). Nothing
read from the wire is trusted: lengths are checked against :data:`MAX_FRAME` and
:data:`MAX_HEADER` before anything is allocated, and every malformed frame is a
:class:`ProtocolError` carrying the MQ reason the server replies with.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import struct
from dataclasses import dataclass
from typing import Any

from gateway.mq.port import AsyncPutStatus, Browse, GetOptions, MQError, PutOptions
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD, MQMD_STRUC_ID
from gateway.wire.reasons import Reason

#: The socket's file name inside the queue manager's data directory.
SOCKET_NAME = "qm.sock"
#: Version of this protocol; the server refuses a client speaking another.
PROTOCOL_VERSION = 1
#: Largest JSON header accepted (requests are small; MQSC scripts are the largest).
MAX_HEADER = 1 << 20
#: Largest frame: MQ's largest message (100 MB) plus a descriptor and a header.
MAX_FRAME = 100 * 1024 * 1024 + MAX_HEADER + 512
_PREFIX = struct.Struct("!II")
_MD_LEN = 364
_ENC_NATIVE = 546

#: Requests the server understands (MQI verbs plus MQSC and the sub-protocol's own).
OPS = frozenset({"connect", "open", "put", "put1", "get", "commit", "backout", "inquire",
                 "close", "mqsc", "disconnect", "get_batch",
                 "put_async", "put1_async", "async_status"})
#: Requests that get no reply (asynchronous put).
NO_REPLY_OPS = frozenset({"put_async", "put1_async"})
#: What the server announces in its ``connect`` reply (``features``): a client sends
#: ``put_async``/``put1_async`` only to a server announcing ``put_async`` (a server from
#: before it closes the connection on an unknown operation, after the client had
#: reported the puts as made), and puts synchronously otherwise. ``compact_batch``: the
#: server answers ``get_batch`` with ``"compact": true`` in :func:`pack_batch`'s form.
FEATURES = ("put_async", "compact_batch")
#: Most messages one ``get_batch`` returns, and the data size past which it stops adding
#: (a later message that would not fit is left on the queue: MQRC 2080 semantics).
MAX_BATCH_MSGS = 10_000
BATCH_BYTES = 8 * 1024 * 1024


class ProtocolError(Exception):
    """A frame broke the protocol; ``reason`` is the MQRC the peer is told, ``who`` says
    which side broke it (``client`` or ``server``)."""

    def __init__(self, reason: int, message: str, who: str = "client") -> None:
        self.reason = int(reason)
        self.who = who
        self.detail = message
        super().__init__(f"{who} broke the queue-manager protocol: {message}")


@dataclass(slots=True)
class Frame:
    """One decoded frame: its JSON object and its binary data."""

    header: dict[str, Any]
    data: bytes = b""


def encode_frame(header: dict[str, Any], data: bytes = b"") -> bytes:
    """Header and data as one frame (ValueError when it would exceed the limits)."""
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(raw) > MAX_HEADER or len(raw) + len(data) + 4 > MAX_FRAME:
        raise ValueError(f"frame of {len(raw) + len(data)} bytes exceeds the protocol limit")
    return _PREFIX.pack(4 + len(raw) + len(data), len(raw)) + raw + data


def frame_length(prefix: bytes, who: str = "client") -> int:
    """The number of bytes following the 4-byte length prefix (checked)."""
    total: int = struct.unpack("!I", prefix)[0]
    if total < 4:
        raise ProtocolError(Reason.DATA_LENGTH_ERROR, f"frame length {total} is too short", who)
    if total > MAX_FRAME:
        raise ProtocolError(
            Reason.DATA_LENGTH_ERROR,
            f"frame length {total} exceeds the limit of {MAX_FRAME} bytes", who,
        )
    return total


def decode_frame(payload: bytes, who: str = "client") -> Frame:
    """Decode what followed the length prefix: header length, JSON object, data."""
    if len(payload) < 4:
        raise ProtocolError(Reason.DATA_LENGTH_ERROR, "frame shorter than its header length", who)
    (hlen,) = struct.unpack_from("!I", payload)
    if hlen > MAX_HEADER or hlen > len(payload) - 4:
        raise ProtocolError(
            Reason.DATA_LENGTH_ERROR, f"header length {hlen} does not fit the frame", who
        )
    try:
        header = json.loads(payload[4 : 4 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(Reason.UNEXPECTED_ERROR,
                            f"header is not JSON: {type(exc).__name__}", who) from None
    if not isinstance(header, dict):
        raise ProtocolError(Reason.UNEXPECTED_ERROR, "header is not a JSON object", who)
    return Frame(header, payload[4 + hlen :])


# ---------------------------------------------------------------- values ---------


def pack_message(md: MQMD, body: bytes) -> bytes:
    """A descriptor (as version 2, native encoding) followed by the body."""
    try:
        packed = md.copy(version=2).pack(_ENC_NATIVE) if md.version < 2 else md.pack(_ENC_NATIVE)
    except WireError as exc:
        raise MQError(Reason.MD_ERROR, f"the message descriptor cannot be sent: {exc}") from exc
    return packed + body


def unpack_message(data: bytes, who: str = "client") -> tuple[MQMD, bytes]:
    """The descriptor and body of :func:`pack_message`'s bytes."""
    if len(data) < _MD_LEN:
        raise ProtocolError(Reason.MD_ERROR, f"message data of {len(data)} bytes has no MQMD", who)
    try:
        md = MQMD.unpack(data, 0, _ENC_NATIVE)
    except WireError as exc:
        raise ProtocolError(Reason.MD_ERROR, f"MQMD cannot be decoded: {exc}", who) from None
    return md, data[_MD_LEN:]


def pack_messages(messages: list[tuple[MQMD, bytes]]) -> tuple[list[int], bytes]:
    """Several messages as one data block: each :func:`pack_message`'s length, and the
    concatenation (the ``get_batch`` reply)."""
    parts = [pack_message(md, body) for md, body in messages]
    return [len(p) for p in parts], b"".join(parts)


def unpack_messages(lengths: object, data: bytes, who: str = "client") -> list[tuple[MQMD, bytes]]:
    """The messages of :func:`pack_messages` (lengths checked against the data)."""
    if not isinstance(lengths, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= _MD_LEN for n in lengths):
        raise ProtocolError(Reason.DATA_LENGTH_ERROR, "lengths must be message sizes", who)
    if sum(lengths) != len(data):
        raise ProtocolError(Reason.DATA_LENGTH_ERROR,
                            f"lengths add up to {sum(lengths)}, the data has {len(data)}", who)
    out: list[tuple[MQMD, bytes]] = []
    view = memoryview(data)
    at = 0
    for n in lengths:
        out.append(unpack_message(bytes(view[at:at + n]), who))
        at += n
    return out


# The compact ``get_batch`` reply (asked with ``"compact": true``): the messages of a
# batch taken off one queue mostly share their descriptors (a sink's backlog: the same
# format, persistence, putter; a new MsgId each), so instead of a packed 364-byte MQMD
# per message (a struct pack and 14 character-field encodings on the server, their
# decoding on the client) the reply header carries the first descriptor's field values
# once (``md``) and, per message, only the fields that differ from the previous one
# (``diffs``: flat ``[index, value, ...]``, byte fields in hexadecimal); the data is the
# bodies back to back (``sizes``). Every value is checked by the client like a packed
# descriptor would be (type, MQLONG range, field size).

#: CHARn fields of the MQMD and their sizes.
_MD_CHAR_SIZES = {"struc_id": 4, "format": 8, "reply_to_q": 48, "reply_to_q_mgr": 48,
                  "user_identifier": 12, "appl_identity_data": 32, "put_appl_name": 28,
                  "put_date": 8, "put_time": 8, "appl_origin_data": 4}
#: MQMD version-2 field names in the order of the compact reply's values.
_MD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(MQMD)
                                   if f.name != "struc_ccsid")
_MD_VALUES = operator.attrgetter(*_MD_NAMES)
#: per field: its kind ("i" MQLONG, "s" CHARn, "b" BYTEn) and size (CHARn, BYTEn)
_MD_KINDS: tuple[tuple[str, int], ...] = tuple(
    ("b", {"msg_id": 24, "correl_id": 24, "accounting_token": 32, "group_id": 24}[n])
    if n in ("msg_id", "correl_id", "accounting_token", "group_id")
    else ("s", _MD_CHAR_SIZES[n]) if n in _MD_CHAR_SIZES else ("i", 0)
    for n in _MD_NAMES
)
_VERSION_AT = _MD_NAMES.index("version")
assert _MD_NAMES[0] == "struc_id" and len(_MD_NAMES) == 29
_LONG_MIN = -(2**31)


def _md_json(i: int, v: Any) -> Any:
    kind = _MD_KINDS[i][0]
    if kind == "b":
        return bytes(v).hex()
    if kind == "s":
        return v.split("\x00", 1)[0].rstrip(" ")  # as a packed field decodes
    return int(v)


#: Fields that usually differ between the messages of a batch (compared one by one);
#: the others are compared as one tuple (in C) and only looked at when that differs.
_MD_HOT = ("msg_id", "correl_id", "backout_count", "put_date", "put_time", "expiry",
           "persistence", "priority")
_HOT_AT = tuple(_MD_NAMES.index(n) for n in _MD_HOT)
_COLD_AT = tuple(i for i in range(len(_MD_NAMES)) if i not in _HOT_AT and i != _VERSION_AT)
_HOT_VALUES = operator.attrgetter(*_MD_HOT)
_COLD_VALUES = operator.attrgetter(*(_MD_NAMES[i] for i in _COLD_AT))


def pack_batch(messages: list[tuple[MQMD, bytes]]) -> tuple[dict[str, Any], bytes]:
    """The compact ``get_batch`` reply (header fields, data) of ``messages`` (see above).
    Every descriptor is sent as version 2, as :func:`pack_message` does."""
    first = list(_MD_VALUES(messages[0][0]))
    first[_VERSION_AT] = 2
    template = [_md_json(i, v) for i, v in enumerate(first)]
    diffs: list[list[Any]] = []
    hot0, cold0 = _HOT_VALUES(messages[0][0]), _COLD_VALUES(messages[0][0])
    pairs = tuple(zip(_HOT_AT, range(len(_HOT_AT)), strict=True))
    for md, _ in messages:
        hot, cold = _HOT_VALUES(md), _COLD_VALUES(md)
        d: list[Any] = []
        if cold != cold0:
            for j, i in enumerate(_COLD_AT):
                if cold[j] != cold0[j]:
                    d += (i, _md_json(i, cold[j]))
            cold0 = cold
        if hot != hot0:
            for i, j in pairs:
                v = hot[j]
                if v != hot0[j]:
                    d += (i, v.hex() if type(v) is bytes else _md_json(i, v))
            hot0 = hot
        diffs.append(d)
    sizes = [len(body) for _, body in messages]
    return {"md": template, "diffs": diffs, "sizes": sizes}, b"".join(b for _, b in messages)


def _strict_hex(v: str) -> bytes | None:
    """``v``'s bytes if it is hex digits only (``bytes.fromhex`` skips whitespace, which
    would make a value of the right length decode to fewer bytes), else None."""
    try:
        b = bytes.fromhex(v)
    except ValueError:
        return None
    return b if 2 * len(b) == len(v) else None


def _md_value(i: Any, v: Any, who: str) -> Any:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(_MD_NAMES):
        raise ProtocolError(Reason.MD_ERROR, f"descriptor field index {i!r} is unknown", who)
    kind, size = _MD_KINDS[i]
    name = _MD_NAMES[i]
    if kind == "i":
        if isinstance(v, int) and not isinstance(v, bool) and _LONG_MIN <= v <= _MAX_LONG:
            return v
    elif kind == "s":
        if isinstance(v, str) and len(v) <= size:
            return v
    elif isinstance(v, str) and len(v) == 2 * size:
        b = _strict_hex(v)
        if b is not None:
            return b
    raise ProtocolError(Reason.MD_ERROR, f"MQMD {name} value {v!r:.60} is not valid", who)


def unpack_batch(header: dict[str, Any], data: bytes,
                 who: str = "client") -> list[tuple[MQMD, bytes]]:
    """The messages of :func:`pack_batch`'s reply, every value checked."""
    template, diffs, sizes = header.get("md"), header.get("diffs"), header.get("sizes")
    if not isinstance(template, list) or len(template) != len(_MD_NAMES):
        raise ProtocolError(Reason.MD_ERROR, "md must hold every descriptor field", who)
    if not isinstance(sizes, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        raise ProtocolError(Reason.DATA_LENGTH_ERROR, "sizes must be message sizes", who)
    if not isinstance(diffs, list) or len(diffs) != len(sizes) or not sizes:
        raise ProtocolError(Reason.MD_ERROR, "diffs must name each message's changes", who)
    if sum(sizes) != len(data):
        raise ProtocolError(Reason.DATA_LENGTH_ERROR,
                            f"sizes add up to {sum(sizes)}, the data has {len(data)}", who)
    values = [_md_value(i, v, who) for i, v in enumerate(template)]
    if values[0] != MQMD_STRUC_ID.rstrip(" ") or values[_VERSION_AT] != 2:
        raise ProtocolError(Reason.MD_ERROR, "md is not an MQMD version 2", who)
    values[0] = MQMD_STRUC_ID
    out: list[tuple[MQMD, bytes]] = []
    at = 0
    kinds, n_fields = _MD_KINDS, len(_MD_NAMES)
    for d, size in zip(diffs, sizes, strict=True):
        if not isinstance(d, list) or len(d) % 2:
            raise ProtocolError(Reason.MD_ERROR, "a diff must be index, value pairs", who)
        for k in range(0, len(d), 2):
            i, v = d[k], d[k + 1]
            if type(i) is not int or not 0 < i < n_fields or i == _VERSION_AT:
                raise ProtocolError(Reason.MD_ERROR, f"a diff cannot change field {i!r:.20}",
                                    who)
            kind, width = kinds[i]
            if kind == "b" and type(v) is str and len(v) == 2 * width:
                b = _strict_hex(v)
                if b is not None:
                    values[i] = b
                    continue
            values[i] = _md_value(i, v, who)
        out.append((MQMD(*values), data[at:at + size]))
        at += size
    return out


def get_options_to_json(o: GetOptions) -> dict[str, Any]:
    return {
        "wait_ms": o.wait_ms,
        "syncpoint": o.syncpoint,
        "browse": o.browse.value if o.browse is not None else None,
        "match_msg_id": o.match_msg_id.hex() if o.match_msg_id is not None else None,
        "match_correl_id": o.match_correl_id.hex() if o.match_correl_id is not None else None,
        "max_length": o.max_length,
        "accept_truncated": o.accept_truncated,
    }


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = obj.get(key, default)
    if value is default:
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = getattr(kind, "__name__", kind)
        raise ProtocolError(Reason.OPTIONS_ERROR, f"{key} must be {name}")
    return value


def _hex(obj: dict[str, Any], key: str) -> bytes | None:
    value = _field(obj, key, str, None)
    if value is None:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ProtocolError(Reason.OPTIONS_ERROR, f"{key} is not hexadecimal") from None
    if len(raw) != 24:
        raise ProtocolError(Reason.OPTIONS_ERROR, f"{key} must be 24 bytes")
    return raw


#: The largest MQLONG: bounds of numbers a client sends.
_MAX_LONG = 2**31 - 1


def get_options_from_json(obj: Any) -> GetOptions:
    if not isinstance(obj, dict):
        raise ProtocolError(Reason.GMO_ERROR, "options must be an object")
    browse = _field(obj, "browse", str, None)
    if browse is not None and browse not in ("first", "next"):
        raise ProtocolError(Reason.GMO_ERROR, f"browse {browse!r} is not first or next")
    wait_ms = _field(obj, "wait_ms", int, 0)
    if not -1 <= wait_ms <= _MAX_LONG:  # MQWI_UNLIMITED (-1) .. an MQLONG
        raise ProtocolError(Reason.GMO_ERROR, f"wait_ms {wait_ms} is out of range")
    max_length = _field(obj, "max_length", int, None)
    if max_length is not None and not 0 <= max_length <= _MAX_LONG:
        raise ProtocolError(Reason.BUFFER_LENGTH_ERROR, f"max_length {max_length} is out of range")
    return GetOptions(
        wait_ms=wait_ms,
        syncpoint=_field(obj, "syncpoint", bool, False),
        browse=Browse(browse) if browse is not None else None,
        match_msg_id=_hex(obj, "match_msg_id"),
        match_correl_id=_hex(obj, "match_correl_id"),
        max_length=max_length,
        accept_truncated=_field(obj, "accept_truncated", bool, False),
    )


def put_options_to_json(o: PutOptions) -> dict[str, Any]:
    return {"syncpoint": o.syncpoint, "new_msg_id": o.new_msg_id,
            "new_correl_id": o.new_correl_id, "set_all_context": o.set_all_context,
            "set_identity_context": o.set_identity_context}


def put_options_from_json(obj: Any) -> PutOptions:
    if not isinstance(obj, dict):
        raise ProtocolError(Reason.PMO_ERROR, "options must be an object")
    return PutOptions(**{k: _field(obj, k, bool, False) for k in (
        "syncpoint", "new_msg_id", "new_correl_id", "set_all_context", "set_identity_context")})


_STATUS_INTS = ("comp_code", "reason", "put_success_count", "put_warning_count",
                "put_failure_count")
_STATUS_STRS = ("object_name", "object_q_mgr_name", "resolved_object_name",
                "resolved_q_mgr_name")


def status_to_json(s: AsyncPutStatus) -> dict[str, Any]:
    """The ``async_status`` reply's fields (MQSTS)."""
    return {"comp_code": s.comp_code, "reason": s.reason,
            "put_success_count": s.put_success_count,
            "put_warning_count": s.put_warning_count,
            "put_failure_count": s.put_failure_count, "object_name": s.object_name,
            "object_q_mgr_name": s.object_q_mgr_name,
            "resolved_object_name": s.resolved_object_name,
            "resolved_q_mgr_name": s.resolved_q_mgr_name}


def status_from_json(obj: dict[str, Any], who: str = "server") -> AsyncPutStatus:
    """An ``async_status`` reply as :class:`AsyncPutStatus` (types checked)."""
    out = AsyncPutStatus()
    for key in _STATUS_INTS:
        value = obj.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(Reason.UNEXPECTED_ERROR, f"{key} must be an integer", who)
        setattr(out, key, value)
    for key in _STATUS_STRS:
        value = obj.get(key, "")
        if not isinstance(value, str):
            raise ProtocolError(Reason.UNEXPECTED_ERROR, f"{key} must be a string", who)
        setattr(out, key, value)
    return out


def error_reply(exc: MQError | ProtocolError) -> dict[str, Any]:
    """The reply carrying a failed call's reason (and whether the server closes)."""
    if isinstance(exc, ProtocolError):
        return {"ok": False, "reason": exc.reason, "comp_code": 2, "message": str(exc),
                "closing": True}
    return {"ok": False, "reason": exc.reason, "comp_code": exc.comp_code,
            "message": exc.detail}
