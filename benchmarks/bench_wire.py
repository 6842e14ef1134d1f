"""Wire codec throughput: decode / encode an MQMD + MQRFH2 publish (psc + usr, 1 KiB payload).

Run: ``.venv/bin/python benchmarks/bench_wire.py [--seconds S]``. Prints messages per
second for decode, encode and both, plus per-structure figures, in both integer
encodings. Bounded: each measurement runs ``--seconds`` (default 2.5 s, best of 5
windows; whole script about 40 s). Figures are single-core, pure Python.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

from gateway.wire.chain import build_message, parse_message
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2

PAYLOAD = bytes(range(256)) * 4  # 1 KiB


def publish_rfh2() -> MQRFH2:
    """A typical queued pub/sub publish command with user properties."""
    rfh2 = MQRFH2()
    rfh2.add_folder(
        "psc",
        [
            ("Command", "Publish"),
            ("Topic", "$SYS/STREAM/STOCK.STREAM/IBM/Latest"),
            ("PubOpt", "RetainPub"),
            ("QMgrName", "QM1"),
            ("QName", "PUBLISHER.Q"),
        ],
    )
    usr = rfh2.add_folder("usr", {"Colour": "Blue", "Exchange": "NYSE", "Region": "EMEA"})
    usr.add("Price", "123.45", dt="r8")
    usr.add("Volume", 1000, dt="i4")
    return rfh2


def message_md() -> MQMD:
    return MQMD(
        version=2,
        msg_type=1,
        format="MQHRF2",
        coded_char_set_id=1208,
        reply_to_q="PUBLISHER.Q",
        reply_to_q_mgr="QM1",
        put_appl_name="publisher",
        msg_id=b"\x01" * 24,
    )


def measure(fn: Callable[[], object], seconds: float, windows: int = 5) -> float:
    """Best calls-per-second of ``fn`` over ``windows`` windows totalling ``seconds``.

    Best-of-N because the figure of interest is the codec's cost, not the noise of other
    processes sharing the machine.
    """
    for _ in range(200):
        fn()
    best = 0.0
    for _ in range(windows):
        n = 0
        start = time.perf_counter()
        deadline = start + seconds / windows
        while True:
            for _ in range(100):
                fn()
            n += 100
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, n / (now - start))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.5, help="per measurement")
    args = parser.parse_args(argv)
    print(f"bench_wire: Python {platform.python_version()} on {platform.machine()}")
    rfh2 = publish_rfh2()
    for encoding in (546, 273):
        md = message_md()
        md.encoding = encoding
        fmt, enc, ccsid, body = build_message(
            [rfh2],
            PAYLOAD,
            "MQSTR",
            payload_ccsid=1208,
            header_encoding=encoding,
            header_ccsid=1208,
        )
        md.format, md.encoding, md.coded_char_set_id = fmt, enc, ccsid
        wire = md.pack(encoding) + body
        md_len = md.length

        def decode(wire: bytes = wire, encoding: int = encoding, md_len: int = md_len) -> object:
            got = MQMD.unpack(wire, 0, encoding)
            return parse_message(got, memoryview(wire)[md_len:])

        def encode(md: MQMD = md, encoding: int = encoding) -> bytes:
            _, _, _, data = build_message(
                [rfh2], PAYLOAD, "MQSTR", header_encoding=encoding, header_ccsid=1208
            )
            return md.pack(encoding) + data

        def both(
            decode: Callable[[], object] = decode, encode: Callable[[], bytes] = encode
        ) -> bytes:
            decode()
            return encode()

        # Sanity: what we measure round-trips.
        parsed = parse_message(MQMD.unpack(wire, 0, encoding), wire[md_len:])
        got_rfh2 = parsed.first(MQRFH2)
        assert parsed.payload == PAYLOAD and got_rfh2 is not None
        assert got_rfh2.folders == rfh2.folders
        assert encode() == wire
        rfh2_bytes = encode_rfh2(rfh2, encoding)

        def md_unpack(wire: bytes = wire, encoding: int = encoding) -> object:
            return MQMD.unpack(wire, 0, encoding)

        def md_pack(md: MQMD = md, encoding: int = encoding) -> bytes:
            return md.pack(encoding)

        def rfh2_decode(data: bytes = rfh2_bytes, encoding: int = encoding) -> object:
            return decode_rfh2(data, encoding)

        def rfh2_encode(encoding: int = encoding) -> bytes:
            return encode_rfh2(rfh2, encoding)

        figures = {
            "decode (MQMD + RFH2 + payload)": measure(decode, args.seconds),
            "encode (MQMD + RFH2 + payload)": measure(encode, args.seconds),
            "decode + encode": measure(both, args.seconds),
            "  MQMD.unpack only": measure(md_unpack, args.seconds),
            "  MQMD.pack only": measure(md_pack, args.seconds),
            "  decode_rfh2 only": measure(rfh2_decode, args.seconds),
            "  encode_rfh2 only": measure(rfh2_encode, args.seconds),
        }
        print(
            f"\nEncoding {encoding} ({'little' if encoding == 546 else 'big'}-endian), "
            f"message {len(wire)} bytes (MQMD {md_len} + RFH2 {len(rfh2_bytes)} + payload "
            f"{len(PAYLOAD)})"
        )
        for label, rate in figures.items():
            print(f"  {label:34s} {rate:>10,.0f} msgs/s  {1e6 / rate:7.2f} µs/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
