"""Per-neighbour facts on /metrics (and the status /healthz and `list --json` share);
the configuration entries that name neighbours (gateway YAML, mqgw broker flags)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.neighbours import NeighbourKind, ProxyKey
from gateway.runtime.config import GatewayConfig
from gateway.runtime.metrics import NeighbourCollector
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.state import NeighbourState
from gateway.runtime.neighbours.status import neighbour_status
from gateway.runtime.pubsub_service.cli import add_arguments, config_from_args


def test_status_and_metrics_per_neighbour(tmp_path: Path) -> None:
    state = NeighbourState(tmp_path / "neighbours.db")
    state.request_join(NeighbourConfig(q_mgr="A", streams=["S1"]), 0.0)
    state.request_join(NeighbourConfig(q_mgr="B"), 0.0)
    state.set_state("A", "active")
    state.heard("A", 990.0)
    state.intend("A", ProxyKey("S1", "t", 2), b"1" * 24, register=True)
    state.intend("A", ProxyKey("S1", "u", 2), b"2" * 24, register=True)
    state.intend("A", ProxyKey("S1", "v", 2), b"3" * 24, register=False)  # withdrawing

    status = {s["q_mgr"]: s for s in neighbour_status(state, 1000.0)}
    assert status["A"]["state"] == "active" and status["B"]["state"] == "joining"
    assert status["A"]["last_heard_age"] == 10.0 and status["B"]["last_heard"] is None
    assert status["A"]["proxy_subscriptions"] == 2
    assert status["A"]["common_streams"] == ["S1", "SYSTEM.BROKER.DEFAULT.STREAM"]

    qm = EmbeddedQueueManager("GW", tmp_path / "qm")
    links = NeighbourLinks(qm, state, subscriptions=list)
    links.counters.commands[("A", "sent")] += 3
    links.counters.commands[("A", "failed")] += 1
    registry = CollectorRegistry()
    registry.register(NeighbourCollector(links, clock=lambda: 1000.0))
    text = generate_latest(registry).decode()
    assert 'mqgw_neighbour_active{neighbour="A"} 1.0' in text
    assert 'mqgw_neighbour_active{neighbour="B"} 0.0' in text
    assert 'mqgw_neighbour_last_heard_seconds{neighbour="A"} 10.0' in text
    assert 'mqgw_neighbour_last_heard_seconds{neighbour="B"}' not in text
    assert 'mqgw_neighbour_proxy_subscriptions{neighbour="A"} 2.0' in text
    assert 'mqgw_neighbour_commands_total{neighbour="A",result="sent"} 3.0' in text
    assert 'mqgw_neighbour_commands_total{neighbour="A",result="failed"} 1.0' in text
    state.close()


def test_gateway_yaml_names_neighbours_in_one_place() -> None:
    top = GatewayConfig.model_validate({"neighbours": [{"q_mgr": "A", "kind": "mqv7"}]})
    assert [(n.q_mgr, n.kind) for n in top.neighbours] == [("A", NeighbourKind.MQV7)]
    under = GatewayConfig.model_validate({"broker": {"neighbours": [{"q_mgr": "B"}]}})
    assert [n.q_mgr for n in under.neighbours] == ["B"]
    with pytest.raises(ValidationError, match="keep one list"):
        GatewayConfig.model_validate(
            {"neighbours": [{"q_mgr": "A"}], "broker": {"neighbours": [{"q_mgr": "B"}]}}
        )
    with pytest.raises(ValidationError, match="listed twice"):
        GatewayConfig.model_validate({"neighbours": [{"q_mgr": "A"}, {"q_mgr": "A"}]})
    for where in ({"neighbours": [{"q_mgr": "GW"}]}, {"broker": {"neighbours": [{"q_mgr": "GW"}]}}):
        with pytest.raises(ValidationError, match="own queue manager"):
            GatewayConfig.model_validate({"queue_manager": {"name": "GW"}, **where})


def test_broker_neighbour_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["--qmgr", "GW", "--qmgr-path", "qm", "--store", "s.db"]
    args = parser.parse_args(
        [*base, "--neighbour", "BROKERA", "--neighbour", "BROKERB:gateway:parent:S1,S2"]
    )
    config = config_from_args(args)
    assert [(n.q_mgr, n.kind, n.role, n.streams) for n in config.neighbours] == [
        ("BROKERA", "mqpubsub", "child", None),
        ("BROKERB", "gateway", "parent", ["S1", "S2"]),
    ]
    twice = parser.parse_args([*base, "--neighbour", "A", "--neighbour", "A:mqv7"])
    with pytest.raises(ValidationError, match="listed twice"):
        config_from_args(twice)
