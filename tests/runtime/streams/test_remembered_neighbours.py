"""The stream union holds the streams of the neighbours ``neighbours.db`` remembers, not
only those of the configuration: a neighbour joined with ``mqgw neighbours join``, or
configured without a stream list, tells its streams at join (StreamSupport), and a
missing queue for one of them loses its publications to the dead-letter queue all the
same (found by tests/network/test_neighbour_failures.py)."""

from __future__ import annotations

from pathlib import Path

from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.runtime.config import load_config
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.state import NeighbourState, neighbours_db_of
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.streams.health import remembered_neighbours, wanted_streams
from tests.runtime.streams.streams_helpers import write_config

B, S, T = "BULLETIN.STREAM", "SPORTS.STREAM", "STOCK.STREAM"


def _remember(path: Path) -> None:
    state = NeighbourState(path)
    try:
        # Joined with the CLI, streams learnt from its StreamSupport.
        state.request_join(NeighbourConfig(q_mgr="BROKERB"), 0.0)
        state.set_learnt_streams("BROKERB", [B, S, DEFAULT_STREAM])
        state.set_state("BROKERB", "active")
        # Refused (a loop) and being cleared: no longer linked, nothing to support.
        state.request_join(NeighbourConfig(q_mgr="LOOPED", streams=["LOOP.STREAM"]), 0.0)
        state.set_state("LOOPED", "refused", "loop: LOOPED is already reachable through X")
        state.request_join(NeighbourConfig(q_mgr="GONE", streams=["GONE.STREAM"]), 0.0)
        state.request_clear("GONE")
    finally:
        state.close()


def test_union_holds_the_remembered_neighbours_streams(tmp_path: Path) -> None:
    loaded = load_config(write_config(tmp_path, [T]), PluginRegistry.from_entry_points())
    db = neighbours_db_of(loaded.path(loaded.gateway.broker.store))
    assert wanted_streams(loaded)[0] == {DEFAULT_STREAM: ("gateway",), T: ("gateway",)}

    _remember(db)
    wanted, _, _ = wanted_streams(loaded)
    assert wanted == {
        DEFAULT_STREAM: ("gateway", "neighbour BROKERB"),
        T: ("gateway",),
        B: ("neighbour BROKERB",),
        S: ("neighbour BROKERB",),
    }
    # The running gateway gives its links' view instead of reading the file again.
    state = NeighbourState(db)
    try:
        remembered = remembered_neighbours(state)
    finally:
        state.close()
    assert remembered == {"BROKERB": frozenset({B, S, DEFAULT_STREAM})}
    assert wanted_streams(loaded, {})[0] == {DEFAULT_STREAM: ("gateway",), T: ("gateway",)}
    assert wanted_streams(loaded, remembered)[0] == wanted
