"""Seed inputs for the fuzz targets: valid encodings of each structure.

Each seed starts with the selector byte fuzz_targets._params reads (0 = Encoding 546,
CCSID 0; 1 = Encoding 273). Seeds let the fuzzer start from deep, valid paths instead
of discovering StrucIds byte by byte.
"""

from __future__ import annotations

from gateway.wire.chain import build_message
from gateway.wire.dlh import MQDLH, encode_dlh
from gateway.wire.folder import Element, serialize_folder
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE, encode_mqmde
from gateway.wire.rfh import MQRFH, encode_rfh, format_name_value_string
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from gateway.wire.xqh import MQXQH, encode_xqh, wrap_for_xmitq

#: Fuzz target names (tests/fuzz/fuzz_targets.py defines one function per name).
TARGET_NAMES = ("mqmd", "rfh", "rfh2", "xqh", "dlh", "mqmde", "folder", "name_values", "chain")


def _rfh2_sample() -> MQRFH2:
    rfh2 = MQRFH2(format="MQSTR", coded_char_set_id=1208)
    rfh2.add_folder("psc", [("Command", "Publish"), ("Topic", "IBM/Latest")])
    rfh2.add_folder("usr", {"Colour": "Blue & <green>"}).children[0].attributes["dt"] = "string"
    return rfh2


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
    }
