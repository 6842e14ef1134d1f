"""examples/scale-out as shipped: every configuration passes ``mqgw run --check``, and
docs/scaling.md shows the files exactly as they are (the page tells operators to copy
them). Fast, no processes: tests/examples/test_scale_out.py runs them."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from gateway.mq.embedded.mqsc import parse_mqsc
from gateway.runtime.cli import main as mqgw_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scale-out"
FILES = ["gw1.yaml", "gw1.mqsc", "gw2.yaml", "gw2.mqsc"]


def test_the_example_is_these_files() -> None:
    assert sorted(p.name for p in EXAMPLE.iterdir() if p.is_file()) == sorted(FILES)


@pytest.mark.parametrize("config", ["gw1.yaml", "gw2.yaml"])
def test_every_configuration_passes_the_check(config: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = mqgw_main(["run", "--config", str(EXAMPLE / config), "--check"])
    assert rc == 0, out.getvalue()
    assert "configuration OK" in out.getvalue()
    assert not (EXAMPLE / "data").exists()  # --check leaves nothing behind


@pytest.mark.parametrize("name", ["gw1.mqsc", "gw2.mqsc"])
def test_mqsc_parses_and_routes_each_stream_to_its_owner(name: str) -> None:
    commands = {c.name: c for c in parse_mqsc((EXAMPLE / name).read_text())}
    own, other = ("S1", "GW2") if name == "gw1.mqsc" else ("S2", "GW1")
    theirs = "S2" if own == "S1" else "S1"
    assert commands[f"{own}.PUBLISH"].attrs["TARGET"] == f"{own}.STREAM"
    remote = commands[f"{theirs}.PUBLISH"].attrs
    assert (remote["RNAME"], remote["RQMNAME"], remote["XMITQ"]) == (
        f"{theirs}.STREAM", other, other)


@pytest.mark.parametrize("name", FILES)
def test_docs_scaling_shows_the_file_verbatim(name: str) -> None:
    docs = (ROOT / "docs" / "scaling.md").read_text()
    text = (EXAMPLE / name).read_text().rstrip("\n")
    assert f"`examples/scale-out/{name}`:" in docs
    assert f"\n{text}\n```" in docs, f"docs/scaling.md does not show {name} as shipped"
