"""The network check's pure core: many small networks, each problem kind found, a
consistent network passing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.runtime.network_check.check import CODES, Unreadable, check_network, printable
from gateway.runtime.network_check.resolution import q_mgr_route, resolve_put
from gateway.runtime.network_check.view import NodeView


def node(q_mgr: str, *, serviced: tuple[str, ...] = (), sinks: dict[str, list[str]] | None = None,
         neighbours: tuple[tuple[str, str, tuple[str, ...]], ...] = (), kind: str = "gateway",
         state: str = "active", mq: dict[str, Any] | None = None,
         no_mq: bool = False) -> NodeView:
    """A node; ``neighbours`` as (q_mgr, role, streams); ``mq`` extra definitions (its
    serviced streams are local queues, transmission queues to every neighbour)."""
    base: dict[str, Any] = {
        "local_queues": list(serviced),
        "transmission_queues": [n for n, _, _ in neighbours],
    }
    for k, v in (mq or {}).items():
        base[k] = (base.get(k) or []) + v if isinstance(v, list) else v
    return NodeView.model_validate({
        "q_mgr": q_mgr, "gateway": f"gw-{q_mgr}", "serviced": list(serviced),
        "sinks": sinks or {},
        "neighbours": [{"q_mgr": n, "kind": kind, "role": r, "state": state,
                        "streams": list(s)} for n, r, s in neighbours],
        "mq": None if no_mq else base,
    })


def to(q_mgr: str, stream: str) -> dict[str, Any]:
    """A QREMOTE sending ``stream`` to ``q_mgr`` over the transmission queue named after it."""
    return {"remote_queues": {stream: {"rname": stream, "rqmname": q_mgr}},
            "transmission_queues": [q_mgr]}


def consistent() -> list[NodeView]:
    """Two gateways, A owning S1 (Kafka sink), B owning S2; each routes the other's
    stream to its owner with a QREMOTE; A is B's parent."""
    a = node("QMA", serviced=("S1",), sinks={"S1": ["kafka"]},
             neighbours=(("QMB", "child", ("SYSTEM.BROKER.DEFAULT.STREAM",)),),
             mq=to("QMB", "S2"))
    b = node("QMB", serviced=("S2",), sinks={"S2": ["mqtt"]},
             neighbours=(("QMA", "parent", ("SYSTEM.BROKER.DEFAULT.STREAM",)),),
             mq=to("QMA", "S1"))
    return [a, b]


def codes(views: list[NodeView], **kw: Any) -> list[str]:
    return sorted({p.code for p in check_network(views, **kw).problems})


def test_a_consistent_network_passes() -> None:
    report = check_network(consistent())
    assert report.ok, report.text()
    owners = {s.stream: (s.owners, s.owned_by) for s in report.streams}
    assert owners == {"S1": (("QMA",), "routing"), "S2": (("QMB",), "routing")}
    assert report.text().endswith("all well")
    assert report.to_json()["ok"] is True


def test_a_three_node_tree_with_a_cluster_passes() -> None:
    """A cluster routes S1 to A from B and C; a QREMOTE at C routes S2 to B through A's
    queue-manager alias... kept simple: clusters reach every member."""
    cluster = {"cluster_q_mgrs": ["QMA", "QMB", "QMC"]}
    a = node("QMA", serviced=("S1",), sinks={"S1": ["k"]},
             neighbours=(("QMB", "child", ()), ("QMC", "child", ())),
             mq={**cluster, "cluster_queues": {"S2": ["QMB"]}})
    b = node("QMB", serviced=("S2",), sinks={"S2": ["k"]}, neighbours=(("QMA", "parent", ()),),
             mq={**cluster, "cluster_queues": {"S1": ["QMA"]}})
    c = node("QMC", neighbours=(("QMA", "parent", ()),),
             mq={**cluster, "cluster_queues": {"S1": ["QMA"], "S2": ["QMB"]}})
    assert check_network([a, b, c]).ok, check_network([a, b, c]).text()


def test_a_stream_owned_twice_by_routing() -> None:
    """B routes S1 to A, D routes it to C, which services S1 too: two owners."""
    a, b = consistent()
    c = node("QMC", serviced=("S1",), neighbours=(), mq=to("QMB", "S2"))
    d = node("QMD", mq={**to("QMC", "S1"), "transmission_queues": ["QMC", "QMA", "QMB"]})
    report = check_network([a, b, c, d])
    owned = [p for p in report.problems if p.code == "stream-owned-twice"]
    assert [p.subject for p in owned] == ["S1"] and owned[0].nodes == ("QMA", "QMC")


def test_a_stream_owned_twice_by_sinks() -> None:
    """No routing at all: two nodes service S1 and both run its sinks."""
    a = node("QMA", serviced=("S1",), sinks={"S1": ["k1"]}, no_mq=True)
    b = node("QMB", serviced=("S1",), sinks={"S1": ["k2"]}, no_mq=True)
    assert codes([a, b]) == ["stream-owned-twice"]


def test_a_stream_balanced_over_two_cluster_hosts_is_owned_twice() -> None:
    cluster = {"cluster_q_mgrs": ["QMA", "QMB", "QMC"]}
    a = node("QMA", serviced=("S1",), mq=cluster)
    b = node("QMB", serviced=("S1",), mq=cluster)
    c = node("QMC", mq={**cluster, "cluster_queues": {"S1": ["QMA", "QMB"]}})
    report = check_network([a, b, c])
    assert [p.code for p in report.problems] == ["stream-owned-twice"]


def test_a_sink_on_a_non_owner() -> None:
    """B services S1 on a local queue (for its own subscribers) and runs a sink on it;
    C routes S1 to A, so A owns it and B's sink is on a non-owner."""
    a, _ = consistent()
    b = node("QMB", serviced=("S2", "S1"), sinks={"S2": ["mqtt"], "S1": ["stray"]},
             neighbours=(("QMA", "parent", ("SYSTEM.BROKER.DEFAULT.STREAM",)),),
             mq={"transmission_queues": ["QMA"]})
    c = node("QMC", mq={"transmission_queues": ["QMA", "QMB"],
                        "remote_queues": {"S1": {"rname": "S1", "rqmname": "QMA"},
                                          "S2": {"rname": "S2", "rqmname": "QMB"}}})
    report = check_network([a, b, c])
    sinks = [p for p in report.problems if p.code == "sink-on-non-owner"]
    assert len(sinks) == 1 and "stray on QMB" in sinks[0].text and "owner is QMA" in sinks[0].text


def test_a_sink_on_a_node_that_does_not_service_its_stream() -> None:
    a = node("QMA", serviced=("S1",), no_mq=True)
    b = node("QMB", sinks={"S1": ["k"]}, no_mq=True)
    report = check_network([a, b])
    assert [p.code for p in report.problems] == ["sink-on-non-owner"]
    assert "owner is QMA" in report.problems[0].text


def test_a_missing_route_to_the_owner() -> None:
    a, b = consistent()
    b = node("QMB", serviced=("S2",), sinks={"S2": ["mqtt"]},
             neighbours=(("QMA", "parent", ("SYSTEM.BROKER.DEFAULT.STREAM",)),),
             mq={"transmission_queues": []})
    b = NodeView.model_validate({**b.model_dump(), "mq": {"local_queues": ["S2"]}})
    report = check_network([a, b])
    assert [(p.code, p.subject) for p in report.problems] == [
        ("neighbour-no-route", "QMB-QMA"), ("owner-no-route", "S1@QMB")], report.text()


def test_a_stream_not_defined_on_a_node_is_not_routed() -> None:
    a, b = consistent()
    b = NodeView.model_validate({**b.model_dump(), "mq": {"local_queues": ["S2"],
                                                          "transmission_queues": ["QMA"]}})
    report = check_network([a, b])
    assert [(p.code, p.subject) for p in report.problems] == [("stream-not-routed", "S1@QMB")]
    assert "S1 is not defined on QMB (2085)" in report.problems[0].text


def test_a_route_into_a_dead_end() -> None:
    """A routes S3 to its owner C; B routes it to S3X at A, which A does not define."""
    a, b = consistent()
    c = node("QMC", serviced=("S3",), sinks={"S3": ["k"]}, no_mq=False,
             mq={"transmission_queues": ["QMA", "QMB"],
                 "remote_queues": {"S1": {"rname": "S1", "rqmname": "QMA"},
                                   "S2": {"rname": "S2", "rqmname": "QMB"}}})
    a = NodeView.model_validate({**a.model_dump(), "mq": {
        "local_queues": ["S1"], "transmission_queues": ["QMB", "QMC"],
        "remote_queues": {"S2": {"rname": "S2", "rqmname": "QMB"},
                          "S3": {"rname": "S3", "rqmname": "QMC"}}}})
    b = NodeView.model_validate({**b.model_dump(), "mq": {
        "local_queues": ["S2"], "transmission_queues": ["QMA", "QMC"],
        "remote_queues": {"S1": {"rname": "S1", "rqmname": "QMA"},
                          "S3": {"rname": "S3X", "rqmname": "QMA"}}}})
    report = check_network([a, b, c])
    bad = [p for p in report.problems if p.code == "stream-not-routed"]
    assert [p.subject for p in bad] == ["S3@QMB"], report.text()
    assert "S3X is not defined on QMA" in bad[0].text


def test_the_owner_not_servicing_its_routed_stream() -> None:
    a, b = consistent()
    a = NodeView.model_validate({**a.model_dump(), "serviced": []})
    report = check_network([a, b])
    assert "owner-not-serviced" in {p.code for p in report.problems}


def test_a_one_sided_neighbour() -> None:
    a, b = consistent()
    b = NodeView.model_validate({**b.model_dump(), "neighbours": []})
    report = check_network([a, b])
    assert [p.code for p in report.problems] == ["neighbour-one-sided"]
    assert report.problems[0].text == "QMA lists QMB as a neighbour (child), QMB does not list QMA"


def test_roles_that_do_not_match() -> None:
    a, b = consistent()
    b = NodeView.model_validate({**b.model_dump(), "neighbours": [
        {**b.neighbours[0].model_dump(), "role": "child"}]})
    assert codes([a, b]) == ["neighbour-role-mismatch"]


def test_shared_streams_that_differ_and_a_wrong_kind() -> None:
    a, b = consistent()
    b = NodeView.model_validate({**b.model_dump(), "neighbours": [
        {**b.neighbours[0].model_dump(), "streams": ["S1"], "kind": "mqpubsub"}]})
    report = check_network([a, b])
    assert {p.code for p in report.problems} == {
        "neighbour-streams-differ", "neighbour-kind-mismatch"}
    differ = next(p for p in report.problems if p.code == "neighbour-streams-differ")
    assert "only QMB shares S1" in differ.text


def test_a_link_not_active_and_two_parents() -> None:
    a = node("QMA", neighbours=(("QMB", "parent", ()), ("QMC", "parent", ())),
             state="refused")
    report = check_network([a], neighbourhood=True)
    assert {p.code for p in report.problems} == {"neighbour-not-active", "neighbour-parents"}


def test_a_loop_of_three() -> None:
    a = node("QMA", neighbours=(("QMB", "child", ()), ("QMC", "parent", ())))
    b = node("QMB", neighbours=(("QMA", "parent", ()), ("QMC", "child", ())))
    c = node("QMC", neighbours=(("QMB", "parent", ()), ("QMA", "child", ())))
    report = check_network([a, b, c])
    loops = [p for p in report.problems if p.code == "neighbour-loop"]
    assert len(loops) == 1 and loops[0].nodes == ("QMA", "QMB", "QMC")
    assert "close a loop: QM" in loops[0].text


def test_a_loop_through_a_node_not_read_is_found() -> None:
    """The edges come from what every read node lists: A-X and B-X and A-B close a
    loop even though X (a legacy broker) was not read."""
    a = node("QMA", neighbours=(("QMB", "child", ()), ("X", "child", ())))
    b = node("QMB", neighbours=(("QMA", "parent", ()), ("X", "child", ())))
    report = check_network([a, b])
    assert "neighbour-loop" in {p.code for p in report.problems}


def test_a_tree_is_no_loop() -> None:
    a = node("QMA", neighbours=(("QMB", "child", ()), ("QMC", "child", ())))
    b = node("QMB", neighbours=(("QMA", "parent", ()), ("QMD", "child", ())))
    c = node("QMC", neighbours=(("QMA", "parent", ()),))
    d = node("QMD", neighbours=(("QMB", "parent", ()),))
    assert check_network([a, b, c, d]).ok


def test_unread_nodes_and_neighbours() -> None:
    a, _ = consistent()
    report = check_network([a], [Unreadable("http://127.0.0.1:1/healthz", "refused")])
    assert {p.code for p in report.problems} == {"node-unreadable", "neighbour-not-read"}
    # the node looking at its own neighbourhood does not expect its neighbours read
    assert check_network([a], neighbourhood=True).ok


def test_a_legacy_neighbour_is_a_note_not_a_problem() -> None:
    a = node("QMA", neighbours=(("BROKERA", "parent", ()),), kind="mqpubsub")
    report = check_network([a])
    assert report.ok and any("BROKERA (mqpubsub)" in n for n in report.notes)


def test_two_nodes_with_one_name() -> None:
    a, b = consistent()
    assert "node-duplicate" in codes([a, b, a])


def test_a_node_without_mq_definitions_is_judged_on_the_rest() -> None:
    a, b = consistent()
    b = NodeView.model_validate({**b.model_dump(), "mq": None})
    report = check_network([a, b])
    assert report.ok, report.text()
    assert any("QMB does not describe its MQ definitions" in n for n in report.notes)


def test_every_code_is_documented() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert [c for c in CODES if f"`{c}`" not in docs] == []


# ---------------------------------------------------------------- resolution -------


def test_resolution_follows_aliases_and_qm_aliases() -> None:
    a = node("QMA", serviced=("S1",))
    b = node("QMB", mq={
        "alias_queues": {"PUB.S1": "R.S1"},
        "remote_queues": {"R.S1": {"rname": "S1", "rqmname": "QMA"},
                          "HUB": {"rname": "", "rqmname": "QMA"},
                          "VIA.HUB": {"rname": "S1", "rqmname": "HUB"}},
        "transmission_queues": ["QMA"]})
    views = {v.q_mgr: v for v in (a, b)}
    ended = resolve_put(views, "QMB", "PUB.S1")
    assert ended.arrived and (ended.q_mgr, ended.q_name) == ("QMA", "S1"), ended
    assert q_mgr_route(b, "HUB").startswith("qmalias HUB -> QMA")
    # a remote definition consults no queue-manager alias (MQ's rule): 2087
    ended = resolve_put(views, "QMB", "VIA.HUB")
    assert not ended.arrived and "no route to queue manager HUB" in ended.why


def test_resolution_loop_is_bounded() -> None:
    a = node("QMA", mq={**to("QMB", "S1")})
    b = node("QMB", mq={**to("QMA", "S1")})
    ended = resolve_put({v.q_mgr: v for v in (a, b)}, "QMA", "S1")
    assert not ended.arrived and "routing loop" in ended.why


def test_resolution_into_a_node_not_read_is_unknown() -> None:
    a = node("QMA", mq=to("QMX", "S1"))
    ended = resolve_put({"QMA": a}, "QMA", "S1")
    assert ended.unknown and not ended.arrived


# ---------------------------------------------------------------- untrusted views --


@pytest.mark.parametrize("bad", [
    {"q_mgr": "QM<script>"},
    {"q_mgr": "QMA", "serviced": ["S\x1b[31m"]},
    {"q_mgr": "QMA", "gateway": "gw a"},
    {"q_mgr": "A" * 49},
    {"q_mgr": "QMA", "serviced": ["S"] * 5001},
    {"q_mgr": "QMA", "neighbours": [{"q_mgr": "QMB", "kind": "x", "role": "child",
                                     "state": "active"}]},
    {"q_mgr": "QMA", "neighbours": [{"q_mgr": "QMB", "kind": "gateway", "role": "child",
                                     "state": "<b>"}]},
])
def test_a_view_breaking_a_rule_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        NodeView.model_validate(bad)


def test_printable_escapes_control_characters() -> None:
    assert printable("a\x1b[31mb\u202e") == "a\\x1b[31mb\\u202e"


def test_resolution_through_an_intermediate_queue_manager() -> None:
    """C's QREMOTE sends S1@QMA over transmission queue HUB: the message goes to HUB,
    which forwards it to QMA over its own transmission queue; without that queue at HUB
    the put ends there (2087)."""
    a = node("QMA", serviced=("S1",))
    hub = node("HUB", mq={"transmission_queues": ["QMA"]})
    c = node("QMC", mq={"remote_queues": {"S1": {"rname": "S1", "rqmname": "QMA",
                                                 "xmitq": "HUB"}},
                        "transmission_queues": ["HUB"]})
    views = {v.q_mgr: v for v in (a, hub, c)}
    ended = resolve_put(views, "QMC", "S1")
    assert ended.arrived and ended.q_mgr == "QMA", ended
    assert ended.path == ("QMC: qremote S1 -> S1@QMA", "HUB: xmitq QMA", "QMA: local S1")
    views["HUB"] = node("HUB")
    ended = resolve_put(views, "QMC", "S1")
    assert not ended.arrived and "HUB has no route to queue manager QMA (2087)" in ended.why


def test_a_receiving_queue_manager_alias_renames_the_target() -> None:
    """A message for OLDQM arriving at HUB, where OLDQM is a queue-manager alias for QMA
    (ROME -> PALERMO in docs/networks.md), goes on to QMA."""
    a = node("QMA", serviced=("S1",))
    hub = node("HUB", mq={"remote_queues": {"OLDQM": {"rname": "", "rqmname": "QMA"}},
                          "transmission_queues": ["QMA"]})
    c = node("QMC", mq={"remote_queues": {"S1": {"rname": "S1", "rqmname": "OLDQM",
                                                 "xmitq": "HUB"}},
                        "transmission_queues": ["HUB"]})
    ended = resolve_put({v.q_mgr: v for v in (a, hub, c)}, "QMC", "S1")
    assert ended.arrived and ended.q_mgr == "QMA", ended
