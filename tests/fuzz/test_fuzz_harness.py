"""The fuzz harness itself: seeds are valid inputs and `make fuzz` runs every target."""

from __future__ import annotations

import pathlib

import pytest

from gateway.pubsub.admin_messages import decode_admin_publication
from gateway.wire.chain import parse_message
from gateway.wire.dlh import decode_dlh
from gateway.wire.folder import parse_folder
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import decode_mqmde
from gateway.wire.pcf import decode_pcf
from gateway.wire.rfh import decode_rfh, parse_name_value_string
from gateway.wire.rfh2 import decode_rfh2
from gateway.wire.xqh import decode_xqh
from tests.fuzz import run_fuzz
from tests.fuzz.seeds import TARGET_NAMES, seeds


def test_every_target_has_seeds_that_decode_cleanly() -> None:
    all_seeds = seeds()
    assert set(all_seeds) == set(TARGET_NAMES)
    enc = {0: 546, 1: 273, 3: 546}
    for name, inputs in all_seeds.items():
        assert inputs, name
        for data in inputs:
            if name == "folder":
                assert parse_folder(data.decode()).name
            elif name == "name_values":
                assert parse_name_value_string(data.decode("latin-1"))
            elif name == "admin_publication":
                fmt = ("MQADMIN", "MQPCF", "MQHRF", "MQHRF2")[data[1]]
                md = MQMD(format=fmt, encoding=enc[data[0]], coded_char_set_id=0)
                pub = decode_admin_publication(md, data[2:])
                assert pub.kind in ("StreamSupport", "Parent") and pub.retained
            elif name == "chain":
                fmt = "MQHRF2" if data[0] == 0 else "MQDEAD"
                parsed = parse_message(MQMD(format=fmt, encoding=546), data[1:])
                assert parsed.headers and parsed.format == "MQSTR"
            else:
                decoder = {
                    "mqmd": lambda b, e: MQMD.unpack(b, 0, e),
                    "rfh": decode_rfh,
                    "rfh2": decode_rfh2,
                    "xqh": decode_xqh,
                    "dlh": decode_dlh,
                    "mqmde": decode_mqmde,
                    "pcf": lambda b, e: decode_pcf(b, e)[1],
                }[name]
                assert decoder(data[1:], enc[data[0]])


@pytest.mark.slow
def test_run_fuzz_runs_each_target_briefly(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run_fuzz.main(["--seconds", str(len(TARGET_NAMES)), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    for name in TARGET_NAMES:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert "no findings" in line
        assert int(line.split("execs")[0].split()[-1]) > 0
    assert (tmp_path / "corpus" / "rfh2").is_dir()
