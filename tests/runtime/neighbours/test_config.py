"""Neighbour configuration: names, kinds, roles, streams, the --neighbour spec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.pubsub.neighbours import NeighbourKind, NeighbourRole
from gateway.runtime.neighbours.config import (
    NeighbourConfig,
    parse_neighbour_spec,
    unique_neighbours,
)


def test_defaults_are_a_legacy_child_with_negotiated_streams() -> None:
    cfg = NeighbourConfig(q_mgr="BROKERA")
    assert cfg.kind is NeighbourKind.MQPUBSUB
    assert cfg.role is NeighbourRole.CHILD
    assert cfg.streams is None
    assert cfg.probe_timeout == 5.0


@pytest.mark.parametrize("name", ["", "A" * 49, "QM 1", "QM*"])
def test_bad_queue_manager_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        NeighbourConfig(q_mgr=name)


def test_streams_are_checked_and_deduplicated() -> None:
    cfg = NeighbourConfig(q_mgr="B", streams=["S2", "S1", "S2"])
    assert cfg.streams == ["S1", "S2"]
    with pytest.raises(ValidationError, match="stream queue name"):
        NeighbourConfig(q_mgr="B", streams=["BAD/STREAM"])


def test_unknown_kind_and_extra_keys_are_refused() -> None:
    with pytest.raises(ValidationError):
        NeighbourConfig.model_validate({"q_mgr": "B", "kind": "mqtt"})
    with pytest.raises(ValidationError):
        NeighbourConfig.model_validate({"q_mgr": "B", "colour": "red"})


def test_spec_parses_every_part() -> None:
    cfg = parse_neighbour_spec("BROKERB:mqv7:parent:BULLETIN.STREAM,SPORTS.STREAM")
    assert cfg.q_mgr == "BROKERB"
    assert cfg.kind is NeighbourKind.MQV7
    assert cfg.role is NeighbourRole.PARENT
    assert cfg.streams == ["BULLETIN.STREAM", "SPORTS.STREAM"]
    assert parse_neighbour_spec("GW").kind is NeighbourKind.MQPUBSUB
    assert parse_neighbour_spec("GW::parent").role is NeighbourRole.PARENT


def test_spec_with_too_many_parts_or_bad_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_neighbour_spec("A:mqv7:child:S:extra")
    with pytest.raises(ValidationError):
        parse_neighbour_spec("A:nonsense")


def test_one_entry_per_queue_manager_and_one_parent() -> None:
    a, b = NeighbourConfig(q_mgr="A"), NeighbourConfig(q_mgr="B")
    assert unique_neighbours([a, b]) == [a, b]
    with pytest.raises(ValueError, match="listed twice"):
        unique_neighbours([a, NeighbourConfig(q_mgr="A", kind="mqv7")])
    pa = NeighbourConfig(q_mgr="A", role="parent")
    pb = NeighbourConfig(q_mgr="B", role="parent")
    with pytest.raises(ValueError, match="at most one neighbour may be the parent"):
        unique_neighbours([pa, pb])


def test_publish_mode_defaults_to_subscribed_and_accepts_all_only() -> None:
    assert NeighbourConfig(q_mgr="QMA").publish == "subscribed"
    assert NeighbourConfig(q_mgr="QMA", publish="all").publish == "all"
    with pytest.raises(ValidationError):
        NeighbourConfig(q_mgr="QMA", publish="everything")  # type: ignore[arg-type]
