"""The generated Kafka configuration and cluster id (pure functions, no JVM)."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from gateway.devstack.kafka import new_cluster_id, server_properties


def _parse(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_cluster_id_is_22_char_base64url_of_16_bytes() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cid in ids:
        assert len(cid) == 22
        assert "=" not in cid
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to "-" first in base64url: the storage tool would read it as an option.
    draws = iter([b"\xf8" * 16, b"\x00" * 16])
    monkeypatch.setattr(secrets, "token_bytes", lambda n: next(draws))
    cid = new_cluster_id()
    assert cid == base64.urlsafe_b64encode(b"\x00" * 16).rstrip(b"=").decode()


def test_single_node_kraft_settings(tmp_path: Path) -> None:
    props = _parse(server_properties(port=19092, controller_port=19093, data_dir=tmp_path / "data"))
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str(tmp_path / "data")
    # one node: every internal topic must be satisfiable with replication factor 1
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_listeners_bind_loopback_only(tmp_path: Path) -> None:
    props = _parse(server_properties(port=1, controller_port=2, data_dir=tmp_path))
    for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
        hosts = [
            part.split("//")[-1].split("@")[-1].rsplit(":", 1)[0] for part in props[key].split(",")
        ]
        assert set(hosts) == {"127.0.0.1"}, key
