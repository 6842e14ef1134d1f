"""The seed's two failure modes of a badly provisioned broker, on the three-process
network (tests/support/neighbour_traffic.py): a subscriber at BROKERA on BULLETIN.STREAM,
publications at BROKERB, GW between them.

The operator's mistake in both: BULLETIN.STREAM is taken out of GW's ``broker.streams``
(no application of GW's own uses it) although both neighbours share it through GW.

1. The queue is deleted too (``mqgw mqsc``, DELETE QLOCAL): B's forwarded publications
   find no stream queue at GW and land on GW's dead-letter queue (MQDLH reason 2085).
   ``mqgw streams check`` exits 1 naming the queue and the count (from /healthz while GW
   runs, from the queue manager once stopped), ``--fix --write-config --replay-dlq``
   defines the queue, services it and puts the publications back; after a restart they
   reach A once each.
2. The queue stays but nothing services it: the publications pile up there; the check
   reports its depth and the age of the oldest; ``--fix --write-config`` and a restart
   deliver them once each.

Each runs with the neighbours' streams configured in GW's YAML and learnt from their
StreamSupport publications (the check must know the union either way).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.devstack.ports import free_port
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.reasons import Reason
from tests.support.legacy_network import BROKERA, BROKERB, GW, LegacyNetwork
from tests.support.neighbour_traffic import (
    BULLETIN,
    GW_QMGRS,
    SETTLE_S,
    SPORTS,
    STOCK,
    has_proxy,
    mqgw_process,
    publications,
    publish,
    register,
    start_joined_network,
    until,
)
from tests.support.pubsub_messages import decode

pytestmark = pytest.mark.slow

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
TOPIC = "News/*"
#: Publications made at B while GW is misprovisioned.
COUNT = 5
#: How long "nothing more arrives" waits for a late duplicate.
QUIET_S = 2.0
#: GW's neighbours with their streams in its YAML, or learnt from their StreamSupport
#: (then only GW's neighbours.db knows that the union holds BULLETIN.STREAM).
LEARN_STREAMS = pytest.mark.parametrize(
    "learn_streams", [False, True], ids=["configured-streams", "learnt-streams"]
)


def _config(net: LegacyNetwork) -> Path:
    return net.root / GW / "gateway.yaml"


def _service_only(net: LegacyNetwork, streams: list[str]) -> None:
    """The operator's edit of GW's YAML: ``broker.streams`` becomes ``streams``."""
    path = _config(net)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["broker"]["streams"] = [{"name": s} for s in streams]
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


async def _subscribed_at_a(net: LegacyNetwork) -> str:
    """A subscriber at A on BULLETIN News/*; the proxies reach B (A→GW→B) and a first
    publication at B arrives once: the network is healthy before the mistake."""
    queue = net.subscriber_queue("A.SUBS")
    await register(net, BROKERA, BULLETIN, TOPIC, queue)
    await until(lambda: has_proxy(net, BROKERB, GW, BULLETIN, TOPIC), SETTLE_S, net,
                "GW's proxy subscription never reached BROKERB")
    await publish(net, BROKERB, BULLETIN, "News/before", b"before")
    got = publications([await net.get(queue)])
    assert [r.payload for r in got] == [b"before"], net.log_tails()
    assert publications(await net.drain(queue)) == []
    return queue


async def _check(net: LegacyNetwork, *options: str) -> tuple[int, dict[str, Any], str]:
    """``mqgw streams check --config GW.yaml OPTIONS`` twice (JSON and text): (exit
    status, the JSON report, the text)."""
    rc, out = await mqgw_process("streams", "check", "--config", str(_config(net)), "--json",
                                 *options)
    assert rc in (0, 1), out
    report = json.loads(out.strip().splitlines()[-1])
    if options:  # a repair: its text is its own, not a second run
        return rc, report, ""
    rc_text, text = await mqgw_process("streams", "check", "--config", str(_config(net)))
    assert rc_text == rc, text
    return rc, report, text


def _facts(report: dict[str, Any], stream: str) -> dict[str, Any]:
    for f in report["streams"]:
        if f["stream"] == stream:
            return dict(f)
    raise AssertionError(f"{stream} is not in the stream union of the report: {report}")


async def _check_until(net: LegacyNetwork, done: Any, what: str) -> tuple[int, dict[str, Any]]:
    """Poll ``mqgw streams check --json`` (GW's /healthz while it runs; sampled every
    second) until ``done(report)``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        rc, out = await mqgw_process("streams", "check", "--config", str(_config(net)), "--json")
        assert rc in (0, 1), out
        report = json.loads(out.strip().splitlines()[-1])
        if done(report):
            return rc, report
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: last report {report}\n{net.log_tails()}")
        await asyncio.sleep(0.5)


async def _dead_letters(net: LegacyNetwork) -> list[tuple[int, str, str, str, bytes]]:
    """GW stopped: what its dead-letter queue holds, browsed on its queue manager:
    (MQDLH reason, DestQName, the original's MQPSCommand and MQPSQMgrName, payload)."""
    out: list[tuple[int, str, str, str, bytes]] = []
    async with (
        EmbeddedQueueManager(GW, net.root / GW / GW_QMGRS / GW) as qm,
        await qm.connect() as conn,
    ):
        h = await conn.open(DLQ, OpenOption.BROWSE)
        browse = Browse.FIRST
        while True:
            try:
                m = await h.get(GetOptions(browse=browse))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
            browse = Browse.NEXT
            dlh, md, body = unwrap_from_dlq(m.md, m.body)
            r = decode(md, body)
            out.append((dlh.reason, dlh.dest_q_name.strip(), r.get("MQPSCommand") or "",
                        r.get("MQPSQMgrName") or "", r.payload))


async def _metrics(port: int) -> str:
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    return await asyncio.to_thread(fetch)


async def _receive(net: LegacyNetwork, queue: str, count: int) -> list[bytes]:
    """Payloads of the publications on TESTER's ``queue``: until ``count`` arrived
    (bounded), then whatever else comes within QUIET_S."""
    got: list[bytes] = []
    deadline = time.monotonic() + SETTLE_S
    while len(got) < count and time.monotonic() < deadline:
        got += [r.payload for r in publications(await net.drain(queue, wait_s=0.5))]
    got += [r.payload for r in publications(await net.drain(queue, wait_s=QUIET_S))]
    return got


@LEARN_STREAMS
async def test_deleted_stream_queue_dead_letters_then_fix_and_replay_deliver_once(
    tmp_path: Path, learn_streams: bool
) -> None:
    metrics_port = free_port()
    net = await start_joined_network(
        tmp_path, metrics_port=metrics_port, learn_streams=learn_streams
    )
    try:
        queue = await _subscribed_at_a(net)

        # The mistake: BULLETIN.STREAM unserviced and its queue deleted.
        assert net.stop(GW) == 0, net.log_tail(GW)
        _service_only(net, [STOCK, SPORTS])
        rc, out = await mqgw_process(
            "mqsc", "--data-dir", str(net.root / GW / GW_QMGRS), GW,
            stdin=f"DELETE QLOCAL({BULLETIN})\n",
        )
        assert rc == 0, out
        await net.restart(GW)

        payloads = [f"dead-{n}".encode() for n in range(COUNT)]
        for p in payloads:
            await publish(net, BROKERB, BULLETIN, f"News/{p.decode()}", p)

        # While GW runs: the check reads /healthz.
        rc, report = await _check_until(
            net, lambda r: _facts(r, BULLETIN)["dead_lettered"] >= COUNT,
            f"{COUNT} dead-lettered publications never reported",
        )
        facts = _facts(report, BULLETIN)
        assert rc == 1 and not report["ok"], report
        assert (facts["queue_exists"], facts["serviced"], facts["dead_lettered"]) == (
            False, False, COUNT), facts
        assert report["dead_letter_queue"] == DLQ
        metrics = await _metrics(metrics_port)
        assert f'mqgw_stream_queue_missing{{stream="{BULLETIN}"}} 1.0' in metrics
        assert f'mqgw_stream_dead_lettered{{stream="{BULLETIN}"}} {float(COUNT)}' in metrics
        assert publications(await net.drain(queue)) == [], "nothing may reach A meanwhile"

        # Stopped: on GW's DLQ, B's forwarded Publish commands, reason 2085 for the
        # stream queue; the check reads the queue manager itself, the text names it all.
        assert net.stop(GW) == 0, net.log_tail(GW)
        dead = await _dead_letters(net)
        assert sorted(dead) == sorted(
            (Reason.UNKNOWN_OBJECT_NAME, BULLETIN, "Publish", BROKERB, p) for p in payloads
        ), dead
        rc, report, text = await _check(net)
        assert rc == 1, text
        assert _facts(report, BULLETIN)["dead_lettered"] == COUNT, report
        assert f"stream queue {BULLETIN} is missing" in text, text
        assert f"{COUNT} publication(s) for {BULLETIN} on {DLQ} (reason 2085)" in text, text

        rc, report, _ = await _check(net, "--fix", "--write-config", "--replay-dlq")
        assert rc == 0, report
        assert f"defined stream queue {BULLETIN}" in report["actions"], report
        assert (
            f"replayed {COUNT} publication(s) from the dead-letter queue to {BULLETIN}"
            in report["actions"]
        ), report
        facts = _facts(report, BULLETIN)
        assert (facts["queue_exists"], facts["serviced"], facts["dead_lettered"]) == (
            True, True, 0), facts
        assert facts["depth"] == COUNT, facts

        await net.restart(GW)
        got = await _receive(net, queue, COUNT)
        assert sorted(got) == sorted(payloads), (got, net.log_tails())
        rc, report = await _check_until(net, lambda r: r["ok"], "the check never said all well")
        assert rc == 0
    finally:
        await net.close()


@LEARN_STREAMS
async def test_unserviced_stream_queue_backlog_is_reported_then_serviced_once(
    tmp_path: Path, learn_streams: bool
) -> None:
    metrics_port = free_port()
    net = await start_joined_network(
        tmp_path, metrics_port=metrics_port, learn_streams=learn_streams
    )
    try:
        queue = await _subscribed_at_a(net)

        # The mistake: BULLETIN.STREAM unserviced; its queue stays.
        assert net.stop(GW) == 0, net.log_tail(GW)
        _service_only(net, [STOCK, SPORTS])
        await net.restart(GW)

        payloads = [f"waiting-{n}".encode() for n in range(COUNT)]
        first_put = time.time()
        for p in payloads:
            await publish(net, BROKERB, BULLETIN, f"News/{p.decode()}", p)

        rc, report = await _check_until(
            net, lambda r: _facts(r, BULLETIN)["depth"] >= COUNT,
            f"a backlog of {COUNT} never reported",
        )
        facts = _facts(report, BULLETIN)
        assert rc == 1 and not report["ok"], report
        assert (facts["queue_exists"], facts["serviced"], facts["depth"]) == (
            True, False, COUNT), facts
        assert facts["oldest_age_s"] is not None, facts
        metrics = await _metrics(metrics_port)
        assert f'mqgw_stream_unserviced_depth{{stream="{BULLETIN}"}} {float(COUNT)}' in metrics
        assert publications(await net.drain(queue)) == [], "nothing may reach A meanwhile"

        assert net.stop(GW) == 0, net.log_tail(GW)
        await asyncio.sleep(max(0.0, first_put + 2.0 - time.time()))
        rc, report, text = await _check(net)
        facts = _facts(report, BULLETIN)
        assert rc == 1, text
        assert (facts["depth"], facts["dead_lettered"]) == (COUNT, 0), facts
        # PutTime has centisecond resolution; the oldest is at least ~2 s old by now.
        assert facts["oldest_age_s"] >= 1.5, facts
        assert facts["oldest_age_s"] <= time.time() - first_put + 5, facts
        assert (
            f"stream queue {BULLETIN} is not serviced: add it to broker.streams "
            f"({COUNT} message(s) waiting)"
        ) in text, text

        rc, report, _ = await _check(net, "--fix", "--write-config")
        assert rc == 0, report
        assert _facts(report, BULLETIN)["serviced"], report

        await net.restart(GW)
        got = await _receive(net, queue, COUNT)
        assert sorted(got) == sorted(payloads), (got, net.log_tails())
        rc, report = await _check_until(net, lambda r: r["ok"], "the check never said all well")
        assert _facts(report, BULLETIN)["depth"] == 0, report
    finally:
        await net.close()
