"""The backlog header encoding of the service CPU pass (issue 16: one JSON encoder, the
field kinds worked out once) writes byte for byte what the documented format's first
encoder wrote: ``json.dumps`` of every field but the payload, in field order."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

from hypothesis import given, settings

from gateway.plugin_api import Envelope
from gateway.runtime.backlog_format import decode_backlog_message, encode_backlog_message
from tests.runtime.test_backlog_format import envelopes


def _reference(envelope: Envelope) -> bytes:
    header: dict[str, Any] = {}
    for f in dataclasses.fields(Envelope):
        if f.name == "payload":
            continue
        value = getattr(envelope, f.name)
        if f.name in ("correl_id", "msg_id", "correlation_data"):
            value = value.hex()
        elif f.name in ("properties", "property_types"):
            value = [[k, v] for k, v in value.items()]
        elif f.name in ("name_value_pairs", "property_list"):
            value = [list(p) for p in value]
        header[f.name] = value
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return b"MQGWENV1" + struct.pack(">I", len(raw)) + raw + envelope.payload


@settings(max_examples=200, deadline=None)
@given(envelopes)
def test_the_encoding_is_the_documented_one_byte_for_byte(env: Envelope) -> None:
    body = encode_backlog_message(env)
    assert body == _reference(env)
    assert decode_backlog_message(body) == env
