"""``mqgw network check`` against real processes: two ``mqgw run`` gateways joined as
neighbours over MQ channels, each owning one stream (a memory sink) and routing the
other's stream to its owner with a QREMOTE, check clean (exit 0); a third gateway that
lists the first as its parent without being listed back, runs a sink on a stream the
first owns and cannot route the second's stream makes the check exit 1 with those
problems' codes in ``--json``. Every gateway's metrics listener requires a bearer token:
the check reads each ``/network`` with the credentials of the node's YAML."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.runtime.network_check.check import Unreadable, check_network
from gateway.runtime.network_check.read import address_of, read_nodes
from gateway.runtime.network_check.view import NodeView
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.legacy_network import free_ports

pytestmark = [pytest.mark.subprocess]

GWA, GWB, GWC = "GWA", "GWB", "GWC"
OWNED = {GWA: "SA.STREAM", GWB: "SB.STREAM"}
#: Seconds the processes get to start and their links to become active (a cold start
#: of two gateways takes a few seconds on the shared 2-core machine; the whole test took
#: 31 s at load average 9 and 55 s at 35-44).
SETTLE_S = 120.0


def _mqsc(me: str, others: dict[str, int | None]) -> str:
    """Channel pairs to each other with a port; a bare transmission queue otherwise."""
    out = ""
    for other, port in others.items():
        out += f"DEFINE QLOCAL({other}) USAGE(XMITQ) DEFPSIST(YES) REPLACE\n"
        if port is not None:
            out += (f"DEFINE CHANNEL({me}.TO.{other}) CHLTYPE(SDR) "
                    f"CONNAME('127.0.0.1({port})') XMITQ({other}) REPLACE\n"
                    f"DEFINE CHANNEL({other}.TO.{me}) CHLTYPE(RCVR) REPLACE\n")
    return out


def _config(root: Path, me: str, ports: dict[str, int], *, streams: list[str],
            sink: str, mqsc: str, neighbours: list[dict[str, Any]]) -> Path:
    (root / f"{me}.mqsc").write_text(mqsc, encoding="utf-8")
    return write_config(root / f"{me}.yaml", {
        "id": me.lower(),
        "queue_manager": {"name": me, "data_dir": f"{me}/qm", "mqsc_file": f"{me}.mqsc",
                          "listener_port": ports[me]},
        "broker": {"store": f"{me}/pubsub.db", "streams": [{"name": s} for s in streams],
                   "wait_ms": 50},
        "metrics": {"port": ports[f"{me}.http"],
                    "auth": {"token": {"file": str(root / "metrics.token")}}},
        "neighbours": neighbours,
        "plugins": [{"name": f"sink-{me.lower()}", "plugin": "memory",
                     "config": {"bus": me, "subscribe": [f"$SYS/STREAM/{sink}/#"]}}],
    })


def _check(root: Path, configs: list[Path]) -> tuple[int, dict[str, Any]]:
    """``mqgw network check --json`` as an operator runs it: its exit status and report."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "network", "check", "--json",
         *map(str, configs)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _wait_until(configs: list[Path], ok: Any, procs: list[GatewayProcess]) -> None:
    """Read the nodes in the test until ``ok(report)`` (every node answering, the links
    settled), bounded by SETTLE_S."""
    addresses = [address_of(str(c)) for c in configs]
    deadline = time.monotonic() + SETTLE_S
    while True:
        got = read_nodes(addresses, timeout=2.0)
        views = [v for _, v in got if isinstance(v, NodeView)]
        report = check_network(views, [v for _, v in got if not isinstance(v, NodeView)])
        if len(views) == len(configs) and ok(report):
            return
        for p in procs:
            assert p.running, f"{p.config.name} exited:\n{p.log_tail()}"
        assert time.monotonic() < deadline, report.text() + "\n" + "\n".join(
            p.log_tail(20) for p in procs)
        time.sleep(0.2)


@pytest.fixture
def processes() -> Iterator[list[GatewayProcess]]:
    procs: list[GatewayProcess] = []
    yield procs
    for p in procs:
        p.terminate(timeout=20)


def test_a_consistent_network_passes_and_a_broken_one_fails(
    tmp_path: Path, processes: list[GatewayProcess]
) -> None:
    ports = free_ports([GWA, GWB, GWC, f"{GWA}.http", f"{GWB}.http", f"{GWC}.http"])
    (tmp_path / "metrics.token").write_text("token-of-the-network-check\n")
    route = "DEFINE QREMOTE({s}) RNAME({s}) RQMNAME({qm}) REPLACE\n"
    a = _config(tmp_path, GWA, ports, streams=[OWNED[GWA]], sink=OWNED[GWA],
                mqsc=_mqsc(GWA, {GWB: ports[GWB]}) + route.format(s=OWNED[GWB], qm=GWB),
                neighbours=[{"q_mgr": GWB, "kind": "gateway", "role": "child", "streams": [],
                             "probe_timeout": 1.5}])
    b = _config(tmp_path, GWB, ports, streams=[OWNED[GWB]], sink=OWNED[GWB],
                mqsc=_mqsc(GWB, {GWA: ports[GWA]}) + route.format(s=OWNED[GWA], qm=GWA),
                neighbours=[{"q_mgr": GWA, "kind": "gateway", "role": "parent", "streams": [],
                             "probe_timeout": 1.5}])
    for cfg in (a, b):
        processes.append(GatewayProcess(cfg, tmp_path / f"{cfg.stem}.log"))
        processes[-1].start()
    _wait_until([a, b], lambda r: r.ok and all(
        n.neighbours and all(nb.state == "active" for nb in n.neighbours) for n in r.nodes),
        processes)

    status, report = _check(tmp_path, [a, b])
    assert status == 0 and report["ok"] and report["problems"] == [], report
    owners = {s["stream"]: (s["owners"], s["owned_by"]) for s in report["streams"]}
    assert owners == {OWNED[GWA]: ([GWA], "routing"), OWNED[GWB]: ([GWB], "routing")}
    assert {n["q_mgr"]: n["neighbours"] for n in report["nodes"]} == {GWA: [GWB], GWB: [GWA]}
    # the view names routing definitions: without the token a node refuses it
    ((_, refused),) = read_nodes([address_of(f"http://127.0.0.1:{ports[f'{GWA}.http']}")],
                                 timeout=5.0)
    assert isinstance(refused, Unreadable) and "HTTP 401" in refused.why, refused

    # GWC: lists GWA as its parent (GWA does not list it), services GWA's stream with a
    # sink of its own, and has no definition routing GWB's stream anywhere
    c = _config(tmp_path, GWC, ports, streams=[OWNED[GWA]], sink=OWNED[GWA],
                mqsc=_mqsc(GWC, {GWA: None, GWB: None}),
                neighbours=[{"q_mgr": GWA, "kind": "gateway", "role": "parent",
                             "streams": [], "probe_timeout": 1.5}])
    processes.append(GatewayProcess(c, tmp_path / "GWC.log"))
    processes[-1].start()
    _wait_until([a, b, c], lambda r: any(n.q_mgr == GWC for n in r.nodes)
                and any(p.code == "neighbour-one-sided" for p in r.problems), processes)

    status, report = _check(tmp_path, [a, b, c])
    assert status == 1 and not report["ok"], report
    found = {(p["code"], p["subject"]) for p in report["problems"]}
    assert {
        ("neighbour-one-sided", f"{GWC}-{GWA}"),
        ("sink-on-non-owner", OWNED[GWA]),
        ("stream-not-routed", f"{OWNED[GWB]}@{GWC}"),
    } <= found, report["problems"]
    # and nothing it should not say: the consistent pair's relation and routes hold
    assert {code for code, _ in found} <= {
        "neighbour-one-sided", "sink-on-non-owner", "stream-not-routed",
        "neighbour-not-active"}, report["problems"]
    not_routed = next(p for p in report["problems"] if p["code"] == "stream-not-routed")
    assert f"{OWNED[GWB]} is not defined on {GWC} (2085)" in not_routed["text"]
