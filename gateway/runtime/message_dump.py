"""What ``mqgw qm browse`` prints for one message, as IBM's amqsbcg does.

Why its own module: the layout (MQMD fields, then every chained header decoded, then the
payload as hex and text) is pure and tested apart from the command. Headers follow the
Format chain (:func:`gateway.wire.chain.parse_message`): MQRFH name/value pairs, MQRFH2
folders (as XML), MQDLH, MQXQH (with the MQMD it carries), MQMDE. A chain that cannot
be decoded is reported and the rest is dumped as payload.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway.wire.chain import parse_message
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH
from gateway.wire.rfh2 import MQRFH2
from gateway.wire.xqh import MQXQH

__all__ = ["dump_message"]

_HEX_WIDTH = 16


def _name(field: str) -> str:
    """``coded_char_set_id`` -> ``CodedCharSetId`` (IBM's field names)."""
    special = {"msg_id": "MsgId", "correl_id": "CorrelId", "reply_to_q": "ReplyToQ",
               "reply_to_q_mgr": "ReplyToQMgr", "coded_char_set_id": "CodedCharSetId",
               "dest_q_name": "DestQName", "dest_q_mgr_name": "DestQMgrName",
               "remote_q_name": "RemoteQName", "remote_q_mgr_name": "RemoteQMgrName",
               "put_appl_type": "PutApplType", "put_appl_name": "PutApplName",
               "struc_id": "StrucId", "user_identifier": "UserIdentifier",
               "appl_identity_data": "ApplIdentityData", "appl_origin_data": "ApplOriginData",
               "group_id": "GroupId", "msg_seq_number": "MsgSeqNumber",
               "name_value_ccsid": "NameValueCCSID", "struc_length": "StrucLength"}
    return special.get(field, "".join(p.capitalize() for p in field.split("_")))


def _value(value: Any) -> str:
    if isinstance(value, bytes):
        return f"X'{value.hex().upper()}'"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _fields(obj: Any, skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [(_name(f.name), _value(getattr(obj, f.name))) for f in dataclasses.fields(obj)
            if f.name not in skip and f.name != "struc_ccsid"]


def _block(title: str, pairs: list[tuple[str, str]]) -> list[str]:
    out = [title]
    for i in range(0, len(pairs), 2):
        row = "".join(f"  {n} : {v}".ljust(40) for n, v in pairs[i : i + 2])
        out.append(row.rstrip())
    return out


def hex_dump(data: bytes) -> list[str]:
    """amqsbcg's payload lines: offset, hex in groups of four bytes, printable text."""
    out = []
    for off in range(0, len(data), _HEX_WIDTH):
        chunk = data[off : off + _HEX_WIDTH]
        groups = " ".join(chunk[i : i + 4].hex().upper() for i in range(0, len(chunk), 4))
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        out.append(f"{off:08X}:  {groups:<35}  '{text}'")
    return out


def dump_message(number: int, md: MQMD, body: bytes, *, qmgr_ccsid: int = 1208) -> str:
    """Everything about one message (see module docstring)."""
    lines = [f"***Message {number}***", *_block("****Message descriptor****", _fields(md))]
    try:
        parsed = parse_message(md, body, qmgr_ccsid=qmgr_ccsid)
        headers, payload = parsed.headers, parsed.payload
        offsets = parsed.header_offsets
    except WireError as exc:
        lines.append(f"****Headers could not be decoded: {exc}****")
        headers, payload, offsets = [], body, []
    for header, offset in zip(headers, offsets, strict=True):
        kind = type(header).__name__
        title = f"****{kind} at offset {offset}****"
        if isinstance(header, MQXQH):
            lines += _block(title, _fields(header, ("msg_desc",)))
            lines += _block("  ****MQMD in the MQXQH****", _fields(header.msg_desc))
        elif isinstance(header, MQRFH2):
            lines += _block(title, _fields(header, ("folders",)))
            for folder in header.folders:
                lines.append(f"  Folder {folder.name}: {folder.to_xml()}")
        elif isinstance(header, MQRFH):
            lines += _block(title, _fields(header, ("name_values",)))
            lines.append(f"  NameValueString : '{header.name_value_string}'")
        else:
            lines += _block(title, _fields(header))
    lines.append(f"****Message data: {len(payload)} bytes****")
    lines += hex_dump(payload)
    return "\n".join(lines) + "\n"
