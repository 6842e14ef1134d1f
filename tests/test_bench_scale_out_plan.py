"""benchmarks/bench_scale_out.py's configurations, without running them: every node's
YAML is a valid gateway configuration, every stream has exactly one owner with the
sinks, the neighbours form a tree, and the MQSC parses. Pure: no brokers, no processes
(the benchmark itself runs in ``make bench``; ``--quick`` is its smoke run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_scale_out import node_config, node_mqsc, plan, streams_of
from gateway.mq.embedded.mqsc import parse_mqsc
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry


@pytest.mark.parametrize(("gateways", "stream_count"), [(1, 2), (2, 2), (4, 4)])
def test_each_stream_has_one_owner_with_its_sinks(
    gateways: int, stream_count: int, tmp_path: Path
) -> None:
    nodes = plan(gateways, stream_count, tmp_path)
    streams = streams_of(stream_count)
    owned = sorted(s for n in nodes.values() for s in n.owns)
    assert owned == sorted(streams)
    registry = PluginRegistry.from_entry_points()
    edges = set()
    for node in nodes.values():
        config = node_config(node, nodes, streams, 256, "127.0.0.1:9", ("127.0.0.1", 1883), "t")
        loaded = parse_config(config, registry, base_dir=tmp_path / node.name)
        assert [s.name for s in loaded.gateway.broker.streams] == streams
        kafka, mqtt_sink = config["plugins"]
        assert [r["stream"] for r in kafka["config"]["outbound"]["routes"]] == node.owns
        assert mqtt_sink["config"]["outbound"]["topics"] == [
            f"$SYS/STREAM/{s}/#" for s in node.owns]
        defined = {(c.obj, c.name) for c in parse_mqsc(node_mqsc(node, streams, 1000))}
        assert {("QALIAS", s.removesuffix(".STREAM") + ".PUBLISH") for s in node.owns} <= defined
        for other in node.neighbours:
            assert ("QLOCAL", other) in defined  # its transmission queue
            edges.add(frozenset((node.name, other)))
    # a tree: n - 1 links, each configured on both sides
    assert len(edges) == gateways - 1
    for edge in edges:
        a, b = sorted(edge)
        assert b in nodes[a].neighbours and a in nodes[b].neighbours
