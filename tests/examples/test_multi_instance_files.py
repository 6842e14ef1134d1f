"""examples/multi-instance as shipped: the configuration passes ``mqgw run --check`` and
docs/operations.md shows it verbatim. Fast, no processes: tests/examples/
test_multi_instance.py runs it."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from gateway.runtime.cli import main as mqgw_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "multi-instance"


def test_the_example_is_one_configuration_and_its_queues() -> None:
    assert sorted(p.name for p in EXAMPLE.iterdir() if p.is_file()) == [
        "gateway.yaml", "ha1.mqsc"]


def test_the_configuration_passes_the_check() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = mqgw_main(["run", "--config", str(EXAMPLE / "gateway.yaml"), "--check"])
    assert rc == 0, out.getvalue()
    assert not (EXAMPLE / "data").exists()  # --check leaves nothing behind (no lock taken)


def test_docs_operations_shows_the_files_verbatim() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    text = (EXAMPLE / "gateway.yaml").read_text().rstrip("\n")
    assert "`examples/multi-instance/gateway.yaml`:" in docs
    assert f"```yaml\n{text}\n```" in docs
    mqsc = (EXAMPLE / "ha1.mqsc").read_text().rstrip("\n")
    assert "`examples/multi-instance/ha1.mqsc`:" in docs
    assert f"```\n{mqsc}\n```" in docs
