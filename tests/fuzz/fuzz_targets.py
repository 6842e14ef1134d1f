"""Coverage-guided fuzz targets (atheris / libFuzzer) for every wire decoder, and the
reader of broker administration publications (PCF from other brokers, untrusted too).

Run one target: ``python tests/fuzz/fuzz_targets.py <target> [libFuzzer flags]``.
``tests/fuzz/run_fuzz.py`` runs them all for a bounded time. The contract checked: any
input either decodes or raises WireError -- any other exception is a finding (libFuzzer
writes it as ``crash-*``), as are hangs (``timeout-*``) and memory blow-ups (``oom-*``).
The first input byte selects the governing Encoding and CCSID so both byte orders and
the ASCII/EBCDIC/UTF-16 paths are explored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["gateway.wire", "gateway.pubsub.admin_messages"]):
    from gateway.pubsub.admin_messages import decode_admin_publication
    from gateway.wire.chain import parse_message
    from gateway.wire.dlh import decode_dlh
    from gateway.wire.errors import WireError
    from gateway.wire.folder import parse_folder
    from gateway.wire.formats import FMT_ADMIN, FMT_PCF, FMT_RF_HEADER, FMT_RF_HEADER_2
    from gateway.wire.mqmd import MQMD
    from gateway.wire.mqmde import decode_mqmde
    from gateway.wire.pcf import decode_pcf
    from gateway.wire.rfh import decode_rfh, parse_name_value_string
    from gateway.wire.rfh2 import decode_rfh2
    from gateway.wire.xqh import decode_xqh, unwrap_from_xmitq

ENCODINGS = (546, 273, 785, 0, 3)
CCSIDS = (0, 819, 1208, 500, 37, 1140, 437, 850, 1200, -2, 4242)
CHAIN_FORMATS = ("MQHRF2", "MQHRF", "MQXMIT", "MQDEAD", "MQHMDE", "MQSTR")
#: MQMD.Format of an admin publication input, picked by its second byte.
ADMIN_FORMATS = (FMT_ADMIN, FMT_PCF, FMT_RF_HEADER, FMT_RF_HEADER_2, "MQSTR")


def _params(data: bytes) -> tuple[int, int, bytes]:
    if not data:
        return 546, 0, b""
    sel = data[0]
    return ENCODINGS[sel % len(ENCODINGS)], CCSIDS[(sel >> 3) % len(CCSIDS)], data[1:]


def _mqmd(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    MQMD.unpack(buf, 0, enc, ccsid)


def _rfh(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_rfh(buf, enc, ccsid=ccsid)


def _rfh2(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_rfh2(buf, enc, ccsid=ccsid)


def _xqh(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_xqh(buf, enc, ccsid=ccsid)
    unwrap_from_xmitq(MQMD(format="MQXMIT", encoding=enc, coded_char_set_id=ccsid), buf)


def _dlh(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_dlh(buf, enc, ccsid=ccsid)


def _mqmde(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_mqmde(buf, enc, ccsid=ccsid)


def _folder(data: bytes) -> None:
    parse_folder(data.decode("utf-8", "replace"))


def _name_values(data: bytes) -> None:
    parse_name_value_string(data.decode("latin-1"))


def _chain(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    fmt = CHAIN_FORMATS[(data[0] if data else 0) % len(CHAIN_FORMATS)]
    parse_message(MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid), buf)


def _pcf(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    decode_pcf(buf, enc, ccsid=ccsid)


def _admin_publication(data: bytes) -> None:
    enc, ccsid, buf = _params(data)
    fmt = ADMIN_FORMATS[(buf[0] if buf else 0) % len(ADMIN_FORMATS)]
    md = MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid)
    decode_admin_publication(md, buf[1:])


TARGETS: dict[str, Callable[[bytes], None]] = {
    "mqmd": _mqmd,
    "rfh": _rfh,
    "rfh2": _rfh2,
    "xqh": _xqh,
    "dlh": _dlh,
    "mqmde": _mqmde,
    "folder": _folder,
    "name_values": _name_values,
    "chain": _chain,
    "pcf": _pcf,
    "admin_publication": _admin_publication,
}


from tests.fuzz.seeds import TARGET_NAMES  # noqa: E402

assert tuple(TARGETS) == TARGET_NAMES


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: fuzz_targets.py <{'|'.join(TARGETS)}> [libFuzzer flags]")
    target = TARGETS[sys.argv[1]]

    def one_input(data: bytes) -> None:
        try:  # noqa: SIM105 -- plain try is cheapest in the fuzz loop
            target(data)
        except WireError:
            pass

    atheris.Setup([sys.argv[0], *sys.argv[2:]], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
