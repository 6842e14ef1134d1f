"""Seed inputs for the fuzz targets: valid encodings of each structure.

Each seed starts with the selector byte fuzz_targets._params reads (0 = Encoding 546,
CCSID 0; 1 = Encoding 273). Seeds let the fuzzer start from deep, valid paths instead
of discovering StrucIds byte by byte.
"""

from __future__ import annotations

from gateway.pubsub.admin_messages import AdminPublication, encode_admin_publication
from gateway.wire.chain import build_message
from gateway.wire.dlh import MQDLH, encode_dlh
from gateway.wire.folder import Element, serialize_folder
from gateway.wire.formats import FMT_ADMIN
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE, encode_mqmde
from gateway.wire.pcf import (
    MQCACF_STREAM_NAME,
    MQCACF_SUPPORTED_STREAM_NAME,
    MQCFT_COMMAND,
    MQCMD_PUBLISH,
    MQIACF_PUBLICATION_OPTIONS,
    IntParam,
    PCFHeader,
    StringListParam,
    StringParam,
    encode_pcf,
)
from gateway.wire.rfh import MQRFH, encode_rfh, format_name_value_string
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from gateway.wire.xqh import MQXQH, encode_xqh, wrap_for_xmitq

#: Fuzz target names (tests/fuzz/fuzz_targets.py defines one function per name).
TARGET_NAMES = (
    "mqmd",
    "rfh",
    "rfh2",
    "xqh",
    "dlh",
    "mqmde",
    "folder",
    "name_values",
    "chain",
    "pcf",
    "admin_publication",
)


def _rfh2_sample() -> MQRFH2:
    rfh2 = MQRFH2(format="MQSTR", coded_char_set_id=1208)
    rfh2.add_folder("psc", [("Command", "Publish"), ("Topic", "IBM/Latest")])
    rfh2.add_folder("usr", {"Colour": "Blue & <green>"}).children[0].attributes["dt"] = "string"
    return rfh2


def _admin_seeds() -> list[bytes]:
    """Selector byte, then the format byte (0 = MQADMIN, 2 = MQHRF: fuzz_targets.
    ADMIN_FORMATS), then the publication: plain PCF in both byte orders and behind an
    MQRFH, as a broker delivers it to an RFH subscriber."""
    support = AdminPublication(
        "StreamSupport", "QM1", ("SYSTEM.BROKER.DEFAULT.STREAM", "S1"), True, "2026112320000000"
    )
    parent = AdminPublication("Parent", "QM2", ("QM1",), True, "2026112320000000")
    _, le = encode_admin_publication(support)
    _, be = encode_admin_publication(parent, encoding=273, ccsid=0)
    head = encode_rfh(
        MQRFH(name_values=[("MQPSCommand", "Publish")], format=FMT_ADMIN, encoding=546)
    )
    return [b"\x00\x00" + le, b"\x01\x00" + be, b"\x00\x02" + head + le]


def seeds() -> dict[str, list[bytes]]:
    """Target name -> list of seed inputs."""
    rfh = MQRFH(
        name_values=[("MQPSCommand", "RegSub"), ("MQPSTopic", 'a "b" c'), ("MQPSRegOpts", "Local")],
        format="MQSTR",
    )
    rfh2 = _rfh2_sample()
    utf16 = _rfh2_sample()
    utf16.name_value_ccsid = 1200
    md = MQMD(version=2, format="MQSTR", reply_to_q="R", group_id=b"g" * 24)
    _, xmit = wrap_for_xmitq(md, b"data", "APP.IN", "QM2")
    _, _, _, dead = build_message([MQDLH(reason=2085, dest_q_name="Q"), rfh2], b"x", "MQSTR")
    folder = serialize_folder(
        Element(
            "pscr",
            children=[
                Element("Completion", text="error"),
                Element("Response", children=[Element("Reason", text="3072")]),
            ],
        )
    )
    pcf_params = [
        IntParam(MQIACF_PUBLICATION_OPTIONS, 2),
        StringParam(MQCACF_STREAM_NAME, "SYSTEM.BROKER.ADMIN.STREAM"),
        StringListParam(MQCACF_SUPPORTED_STREAM_NAME, ["S1", "SYSTEM.BROKER.DEFAULT.STREAM"]),
    ]
    pcf_be = encode_pcf(PCFHeader(type=MQCFT_COMMAND, command=MQCMD_PUBLISH), pcf_params, 273)
    return {
        "mqmd": [b"\x00" + MQMD().pack(), b"\x01" + md.pack(273)],
        "rfh": [b"\x00" + encode_rfh(rfh), b"\x01" + encode_rfh(rfh, 273)],
        "rfh2": [b"\x00" + encode_rfh2(rfh2), b"\x01" + encode_rfh2(utf16, 273)],
        "xqh": [b"\x00" + encode_xqh(MQXQH("Q", "QM")), b"\x00" + xmit],
        "dlh": [b"\x00" + encode_dlh(MQDLH(reason=2085, dest_q_name="Q"))],
        "mqmde": [b"\x00" + encode_mqmde(MQMDE(group_id=b"g" * 24))],
        "folder": [folder.encode(), serialize_folder(rfh2.folders[1]).encode()],
        "name_values": [format_name_value_string(rfh.name_values).encode("latin-1")],
        # selector 0 -> format MQHRF2; 3 -> MQDEAD (see fuzz_targets.CHAIN_FORMATS)
        "chain": [b"\x00" + encode_rfh2(rfh2) + b"payload", b"\x03" + dead],
        "pcf": [b"\x00" + encode_pcf(PCFHeader(), pcf_params), b"\x01" + pcf_be],
        "admin_publication": _admin_seeds(),
    }
