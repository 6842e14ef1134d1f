"""The seed's figure (tests/support/legacy_network.py) with the neighbours joined both
ways, and the MQ application's side of traffic across it: register a subscriber at a
broker, publish at a broker, read what arrived, look at a broker's subscriptions.

Why a module: the failure-mode tests (tests/network) and the SIGKILL trials
(tests/faults) drive the same network the same way.

The neighbours: GW has BROKERA (its parent, STOCK and BULLETIN) and BROKERB (its child,
BULLETIN and SPORTS), their streams named in its YAML or (``learn_streams``) learnt from
their StreamSupport publications; A and B each have GW (``--neighbour``), every kind
``mqpubsub`` (MQRFH commands, as a V6 broker speaks them). GW's queue manager lives
in ``GW/qmgrs/GW`` so ``mqgw mqsc --data-dir GW/qmgrs GW`` reaches it as an operator would.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gateway.mq.port import Message
from gateway.runtime.cli import main as mqgw_main
from gateway.wire.constants import MsgType
from tests.support.legacy_network import (
    BROKERA,
    BROKERB,
    GATEWAY_STREAMS,
    GW,
    TESTER,
    LegacyNetwork,
    start_legacy_network,
)
from tests.support.pubsub_messages import CONTROL, Received, decode, rfh_message

STOCK, BULLETIN, SPORTS = "STOCK.STREAM", "BULLETIN.STREAM", "SPORTS.STREAM"
#: Bound of neighbour negotiation and proxy propagation (a sync per second per hop).
SETTLE_S = 30.0
#: GW's queue managers directory (relative to its YAML); the queue manager is ``GW`` in it.
GW_QMGRS = "qmgrs"

BROKER_NEIGHBOURS: dict[str, list[str]] = {
    BROKERA: ["--neighbour", f"{GW}:mqpubsub:child"],
    BROKERB: ["--neighbour", f"{GW}:mqpubsub:parent"],
}


#: What each neighbour shares with GW (the seed's figure).
NEIGHBOUR_STREAMS = {BROKERA: [STOCK, BULLETIN], BROKERB: [BULLETIN, SPORTS]}


def gateway_extra(
    *,
    serviced: Sequence[str] = GATEWAY_STREAMS,
    metrics_port: int | None = None,
    learn_streams: bool = False,
) -> dict[str, Any]:
    """GW's YAML additions: neighbours A and B (their streams configured, or left to be
    learnt), ``serviced`` as broker.streams, /healthz on ``metrics_port`` (None: metrics
    off), a 1 s sample."""
    neighbours: list[dict[str, Any]] = [
        {"q_mgr": BROKERA, "kind": "mqpubsub", "role": "parent", "probe_timeout": 2.0},
        {"q_mgr": BROKERB, "kind": "mqpubsub", "role": "child", "probe_timeout": 2.0},
    ]
    if not learn_streams:
        for n in neighbours:
            n["streams"] = NEIGHBOUR_STREAMS[n["q_mgr"]]
    return {
        "queue_manager": {"data_dir": f"{GW_QMGRS}/{GW}"},
        "broker": {"streams": [{"name": s} for s in serviced]},
        "metrics": {"enabled": metrics_port is not None, "port": metrics_port or 0},
        "expiry_sweep_interval": 1.0,
        "neighbours": neighbours,
    }


async def start_joined_network(
    root: Path,
    *,
    serviced: Sequence[str] = GATEWAY_STREAMS,
    metrics_port: int | None = None,
    learn_streams: bool = False,
) -> LegacyNetwork:
    """The three processes with the neighbours above; returns once every link is active
    both ways and GW shares each neighbour's streams (the caller closes the network)."""
    net = await start_legacy_network(
        root,
        gateway_extra=gateway_extra(
            serviced=serviced, metrics_port=metrics_port, learn_streams=learn_streams
        ),
        broker_args=BROKER_NEIGHBOURS,
    )
    try:
        await until(lambda: joined(net), SETTLE_S, net, "the neighbours never became active")
    except BaseException:
        await net.close()
        raise
    return net


# ---------------------------------------------------------------- operators' views -----


def mqgw(*argv: str) -> tuple[int, str]:
    """A read-only ``mqgw ARGV`` in this process (no event loop of its own); (rc, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = mqgw_main(list(argv))
    return rc, buf.getvalue()


async def mqgw_process(*argv: str, stdin: str = "", timeout: float = 60.0) -> tuple[int, str]:
    """``mqgw ARGV`` as its own process (what an operator runs); (rc, stdout + stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.runtime.cli", *argv,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode("utf-8", "replace")


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def neighbours_of(net: LegacyNetwork, name: str) -> list[dict[str, Any]]:
    """``mqgw neighbours list --json`` of ``name`` (its neighbours.db)."""
    rc, out = mqgw("neighbours", "list", "--json", "--data-dir", str(net.root / name))
    return json_lines(out) if rc == 0 else []


def joined(net: LegacyNetwork) -> bool:
    """Every link active both ways; GW shares each neighbour's streams."""
    rows = {n["q_mgr"]: n for n in neighbours_of(net, GW)}
    gw = {q: n["state"] for q, n in rows.items()}
    return gw == {BROKERA: "active", BROKERB: "active"} and all(
        set(NEIGHBOUR_STREAMS[q]) <= set(n["common_streams"]) for q, n in rows.items()
    ) and all(
        [(n["q_mgr"], n["state"]) for n in neighbours_of(net, b)] == [(GW, "active")]
        for b in (BROKERA, BROKERB)
    )


def subscriptions_at(net: LegacyNetwork, name: str) -> list[dict[str, Any]]:
    """``mqgw subscriptions --json`` of broker ``name``'s pub/sub store."""
    rc, out = mqgw("subscriptions", "--json", "--store", str(net.root / name / "pubsub.db"))
    return json_lines(out) if rc == 0 else []


def has_proxy(net: LegacyNetwork, at: str, from_q_mgr: str, stream: str, topic: str) -> bool:
    """Whether ``at`` holds ``from_q_mgr``'s proxy subscription for (stream, topic)."""
    return any(
        s["stream"] == stream
        and s["topic"] == topic
        and s["destination"].endswith(f"@{from_q_mgr}")
        for s in subscriptions_at(net, at)
    )


async def until(
    predicate: Callable[[], bool], timeout: float, net: LegacyNetwork, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s\n{net.log_tails()}")
        await asyncio.sleep(0.25)


# ---------------------------------------------------------------- MQ applications -----


async def register(
    net: LegacyNetwork, broker: str, stream: str, topic: str, queue: str, *,
    deregister: bool = False,
) -> None:
    """RegSub (DeregSub) at ``broker`` for TESTER's ``queue``; asserts the OK response
    (read from TESTER's ``<queue>.R``)."""
    replies = net.subscriber_queue(f"{queue}.R")
    msg = rfh_message(
        CONTROL,
        [("MQPSCommand", "DeregSub" if deregister else "RegSub"),
         ("MQPSStreamName", stream), ("MQPSTopic", topic),
         ("MQPSQMgrName", TESTER), ("MQPSQName", queue)],
        reply_to_q=replies, reply_to_q_mgr=TESTER, msg_type=MsgType.REQUEST,
    )
    await net.put(broker, CONTROL, msg.md, msg.body)
    got = await net.get(replies)
    r = decode(got.md, got.body)
    assert r.get("MQPSCompCode") == "0", (broker, r.pairs)


async def publish(net: LegacyNetwork, broker: str, stream: str, topic: str,
                  payload: bytes) -> None:
    """A persistent MQRFH Publish put at ``broker``'s stream queue (as a publisher
    connected to that queue manager would)."""
    msg = rfh_message(
        stream,
        [("MQPSCommand", "Publish"), ("MQPSStreamName", stream), ("MQPSTopic", topic)],
        payload, reply_to_q_mgr=TESTER, persistence=1,
    )
    await net.put(broker, stream, msg.md, msg.body)


def publications(messages: Iterable[Message]) -> list[Received]:
    """The Publish messages among ``messages`` (decoded)."""
    out = []
    for m in messages:
        r = decode(m.md, m.body)
        if r.get("MQPSCommand") == "Publish":
            out.append(r)
    return out
