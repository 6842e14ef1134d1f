"""``mqgw streams check`` (``main(argv)``) on the data directory of a gateway with
neighbours, stopped (issue 29): healthy, it exits 0 (the admin stream a gateway
neighbour announces is serviced); whatever neighbours.db holds, ``--fix
--write-config`` neither crashes nor writes a name no neighbour may add."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.pubsub.neighbours import NeighbourKind
from gateway.pubsub.streams import ADMIN_STREAM, DEFAULT_STREAM
from gateway.runtime.cli import main
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.state import NeighbourState
from tests.runtime.streams.streams_helpers import prepare

B = "BULLETIN.STREAM"
#: What a forged StreamSupport installed before issue 29 (the issue's figure).
FLOOD = ["", "<script>x</script>", "SYSTEM.ADMIN.COMMAND.QUEUE", "A" * 49,
         *(f"JUNK.{i:04d}" for i in range(3003))]


def gateway_with_neighbour(tmp: Path, learnt: list[str]) -> Path:
    """A gateway config with neighbour A (a gateway) and neighbours.db as the links
    leave it once A answered with ``learnt``."""
    cfg = tmp / "gateway.yaml"
    cfg.write_text(
        "queue_manager: {name: GW, data_dir: qm}\n"
        f"broker: {{store: pubsub.db, streams: [{{name: {B}}}]}}\n"
        "neighbours: [{q_mgr: A, kind: gateway}]\n"
        "metrics: {enabled: false}\n"
    )
    state = NeighbourState(tmp / "neighbours.db")
    try:
        state.request_join(NeighbourConfig(q_mgr="A", kind=NeighbourKind.GATEWAY), 0.0)
        state.set_state("A", "active")
        state.set_learnt_streams("A", learnt)
    finally:
        state.close()
    return cfg


def test_a_healthy_gateway_with_a_gateway_neighbour_is_all_well(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a gateway neighbour announces: its streams, the default and admin streams.
    cfg = gateway_with_neighbour(tmp_path, [B, ADMIN_STREAM, DEFAULT_STREAM])
    prepare(tmp_path, [B, ADMIN_STREAM], {}, {})  # the running gateway defined them
    code = main(["streams", "check", "--config", str(cfg), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0, rep["problems"]
    (admin,) = [s for s in rep["streams"] if s["stream"] == ADMIN_STREAM]
    assert admin["serviced"] is True


def test_fix_write_config_with_junk_remembered_neither_crashes_nor_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = gateway_with_neighbour(tmp_path, FLOOD)
    prepare(tmp_path, [B, ADMIN_STREAM], {}, {})
    before = cfg.read_text()
    code = main(["streams", "check", "--config", str(cfg), "--json", "--fix", "--write-config"])
    out = capsys.readouterr().out
    assert code == 0, out
    rep = json.loads(out)
    assert {s["stream"] for s in rep["streams"]} <= {B, ADMIN_STREAM, DEFAULT_STREAM}
    assert cfg.read_text() == before  # nothing to add: the junk is not a stream to service
