"""examples/scale-out (docs/scaling.md) started exactly as shipped: two ``mqgw run``
processes, GW1 owning S1.STREAM and GW2 owning S2.STREAM, joined as ``kind: gateway``
neighbours over their embedded queue managers' channels.

The files are copied unchanged into the test's directory (their paths are relative to
themselves) and given ports and brokers through the environment variables they read,
as an operator would. Everything is checked from outside the gateways:

* publishers are MQ applications on each node's queue manager (its local socket) that
  put MQRFH (S1) and MQRFH2 (S2) publications to ``<stream>.PUBLISH`` at BOTH nodes:
  the MQSC routes them to the owner (an alias there, a QREMOTE elsewhere);
* the owner's sinks are read with Kafka's console consumer and ``mosquitto_sub``;
* each node's MQ subscriber subscribes to the stream the OTHER node owns, so it is
  served through a proxy subscription at the owner.

Every publication must arrive once at each of them, each publisher's order kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker, console_tool_command
from gateway.devstack.ports import free_ports
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.runtime.cli import main as mqgw_main
from gateway.wire.constants import MsgType
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.gateway_process import ChildProcess, mqgw_argv
from tests.support.pubsub_messages import (
    CONTROL,
    decode,
    rfh2_message,
    rfh_message,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.subprocess,
    pytest.mark.kafka,
    pytest.mark.mqtt,
    pytest.mark.mosquitto_clients,
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scale-out"
NODES = {"GW1": "S1.STREAM", "GW2": "S2.STREAM"}  # node -> the stream it owns
OTHER = {"GW1": "GW2", "GW2": "GW1"}
#: Publications per (stream, node it is put at).
PER_PUBLISHER = 25
#: Start-up, join and proxy propagation bound (two JVM-free processes on 2 busy cores).
SETTLE_S = 90.0
#: How long "nothing more arrives" waits for a late duplicate.
QUIET_S = 2.0
PROBE_PREFIX = "scale-out-probe/"


class Node(ChildProcess):
    """One example gateway, ``mqgw run --config <node>.yaml`` from the copied directory."""

    def __init__(self, name: str, root: Path, env: dict[str, str]) -> None:
        config = root / f"{name.lower()}.yaml"
        super().__init__(name, mqgw_argv(config), root / f"{name.lower()}.log", root, env)
        self.data = root / "data" / name.lower()

    @property
    def qm_dir(self) -> Path:
        return self.data / "qm"


def copy_example(root: Path) -> Path:
    """The example's files, unchanged, in ``root``."""
    root.mkdir(parents=True)
    for path in sorted(EXAMPLE.iterdir()):
        if path.suffix in (".yaml", ".mqsc"):
            shutil.copyfile(path, root / path.name)
    return root


def example_env(kafka: KafkaBroker, mqtt: MosquittoBroker) -> dict[str, str]:
    """The environment the example reads: free ports, the session's brokers."""
    ports = free_ports(4)
    return {
        "MQGW_GW1_PORT": str(ports[0]),
        "MQGW_GW2_PORT": str(ports[1]),
        "MQGW_GW1_METRICS_PORT": str(ports[2]),
        "MQGW_GW2_METRICS_PORT": str(ports[3]),
        "MQGW_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "MQGW_MQTT_HOST": mqtt.host,
        "MQGW_MQTT_PORT": str(mqtt.port),
        "PYTHONUNBUFFERED": "1",
    }


def mqgw(*argv: str) -> tuple[int, str]:
    """``mqgw ARGV`` in this process (read-only commands while the nodes run)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = mqgw_main(list(argv))
    return rc, buf.getvalue()


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def neighbour_states(node: Node) -> dict[str, str]:
    rc, text = mqgw("neighbours", "list", "--json", "--data-dir", str(node.data))
    assert rc == 0, text
    return {n["q_mgr"]: n["state"] for n in json_lines(text)}


def proxies_from(owner: Node, q_mgr: str, stream: str, topic: str) -> list[str]:
    """Subscriptions at ``owner`` that ``q_mgr`` registered on ``stream`` for ``topic``."""
    rc, text = mqgw("subscriptions", "--json", "--store", str(owner.data / "pubsub.db"))
    assert rc == 0, text
    return [s["topic"] for s in json_lines(text)
            if s["destination"].endswith(f"@{q_mgr}") and s["stream"] == stream
            and topic in s["topic"]]


def started(node: Node) -> Callable[[], bool]:
    return lambda: node.has_logged(f"gateway scale-out-{node.name.lower()} started")


def logs(nodes: dict[str, Node]) -> str:
    return "\n".join(f"==== {n} ====\n{node.log_tail(30)}" for n, node in nodes.items())


async def until(predicate: Callable[[], bool], what: str, nodes: dict[str, Node],
                timeout: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for name, node in nodes.items():
            assert node.running, f"{name} exited:\n{node.log_tail()}"
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (within {timeout:.0f} s)\n{logs(nodes)}")
        await asyncio.sleep(0.25)


# ------------------------------------------------------------- MQ applications -----


async def subscribe(node: Node, stream: str, topic: str) -> None:
    """An MQRFH2 RegSub request put on ``node``'s control queue by a local application:
    the publications go to its APP.SUBSCRIBER queue; the response must say OK."""
    msg = rfh2_message(CONTROL, [("Command", "RegSub"),
                                 ("Topic", f"$SYS/STREAM/{stream}/{topic}"),
                                 ("QMgrName", node.name), ("QName", "APP.SUBSCRIBER")],
                       reply_to_q="APP.REPLIES", reply_to_q_mgr="",
                       msg_type=MsgType.REQUEST)
    async with await connect_local(node.qm_dir) as conn:
        await conn.put1(CONTROL, msg.md, msg.body)
        replies = await conn.open("APP.REPLIES", OpenOption.INPUT_SHARED)
        got = await replies.get(GetOptions(wait_ms=int(SETTLE_S * 1000)))
    response = decode(got.md, got.body)
    assert response.get("pscr/Completion") == "ok", (node.name, response.folders)


def publication(stream: str, topic: str, payload: bytes, reply_to_q: str,
                ) -> tuple[MQMD, bytes]:
    """An MQRFH (V6 style) publication for S1, an MQRFH2 one for S2 (datagrams)."""
    if stream == "S1.STREAM":
        msg = rfh_message(stream, [("MQPSCommand", "Publish"), ("MQPSStreamName", stream),
                                   ("MQPSTopic", topic)], payload,
                          reply_to_q=reply_to_q, reply_to_q_mgr="")
    else:
        msg = rfh2_message(stream, [("Command", "Publish"),
                                    ("Topic", f"$SYS/STREAM/{stream}/{topic}")],
                           payload, reply_to_q=reply_to_q, reply_to_q_mgr="")
    return msg.md, msg.body


async def publish(node: Node, stream: str, topic: str, payloads: list[bytes]) -> None:
    """Put each payload to ``<stream>.PUBLISH`` at ``node``, one put at a time. At the
    non-owner the publisher names a ReplyToQ (for error responses), so MQ sets the
    ReplyToQMgr to the non-owner, as a legacy MQRFH publisher's messages have it."""
    queue = stream.removesuffix(".STREAM") + ".PUBLISH"
    reply_to_q = "" if NODES[node.name] == stream else "APP.REPLIES"
    async with await connect_local(node.qm_dir) as conn:
        handle = await conn.open(queue, OpenOption.OUTPUT)
        for payload in payloads:
            md, body = publication(stream, topic, payload, reply_to_q)
            await handle.put(md, body)
        await handle.close()


async def subscriber_payloads(node: Node, count: int, timeout: float) -> list[bytes]:
    """Payloads on ``node``'s APP.SUBSCRIBER: ``count`` of them, then whatever else
    arrives within QUIET_S (a duplicate would)."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    async with await connect_local(node.qm_dir) as conn:
        handle = await conn.open("APP.SUBSCRIBER", OpenOption.INPUT_SHARED)
        while True:
            left = deadline - time.monotonic()
            if len(out) >= count:
                left = QUIET_S
            elif left <= 0:
                break
            try:
                msg = await handle.get(GetOptions(wait_ms=int(min(left, 5.0) * 1000)))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
                if len(out) >= count:
                    break
                continue
            out.append(decode(msg.md, msg.body).payload)
    return out


# ------------------------------------------------------------- outside clients -----


async def mosquitto_sub(mqtt: MosquittoBroker, topics: list[str],
                        ) -> asyncio.subprocess.Process:
    """``mosquitto_sub`` printing ``topic|payload`` per message, returned once it is
    subscribed (a probe publication came back)."""
    probe = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    args = [a for t in [*topics, probe] for a in ("-t", t)]
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", mqtt.host, "-p", str(mqtt.port), "-V", "5", "-q", "1",
        *args, "-F", "%t|%p", stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        while True:
            pub = await asyncio.create_subprocess_exec(
                "mosquitto_pub", "-h", mqtt.host, "-p", str(mqtt.port), "-V", "5",
                "-q", "1", "-t", probe, "-m", "probe")
            await pub.wait()
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(f"{probe}|".encode()), line
            return proc


async def mqtt_lines(proc: asyncio.subprocess.Process, count: int, timeout: float,
                     ) -> list[str]:
    """``count`` lines within ``timeout``, and whatever else comes within QUIET_S after
    them (a duplicate would); then ``mosquitto_sub`` is stopped."""
    assert proc.stdout is not None
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        wait = QUIET_S if len(out) >= count else deadline - time.monotonic()
        if wait <= 0:
            break
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), wait)
        except TimeoutError:
            break
        if not line:
            break
        if not line.startswith(PROBE_PREFIX.encode()):  # a late copy of the probe
            out.append(line.decode().rstrip("\n"))
    if proc.returncode is None:
        proc.kill()
    await proc.wait()
    return out


def kafka_acknowledged(env: dict[str, str], name: str) -> float:
    """``mqgw_messages_out_total`` of ``name``'s kafka sink (its /metrics)."""
    url = f"http://127.0.0.1:{env[f'MQGW_{name}_METRICS_PORT']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("mqgw_messages_out_total{") and 'plugin="kafka"' in line)


def kafka_records(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """(key, value) of every record of ``topic``, read by Kafka's console consumer from
    the beginning until nothing more comes for 10 s (a late duplicate would)."""
    proc = subprocess.run(
        console_tool_command(
            "kafka-console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--from-beginning", "--timeout-ms", "10000",
            "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|"),
        capture_output=True, timeout=120, check=False)
    lines = proc.stdout.decode(errors="replace").splitlines()
    return [(k, v) for k, _, v in (ln.partition("|") for ln in lines if ln)]


def in_order_once(received: list[bytes], sent: dict[str, list[bytes]]) -> list[str]:
    """Problems: a publication missing or duplicated, a publisher's order broken."""
    problems = []
    for publisher, payloads in sent.items():
        mine = [p for p in received if p in set(payloads)]
        if sorted(mine) != sorted(payloads):
            missing = len(set(payloads) - set(mine))
            problems.append(f"{publisher}: {len(mine)} of {len(payloads)} received "
                            f"({missing} missing, {len(mine) - len(set(mine))} twice)")
        elif mine != payloads:
            problems.append(f"{publisher}: out of order")
    expected = {p for payloads in sent.values() for p in payloads}
    strays = [p for p in received if p not in expected]
    if strays:
        problems.append(f"{len(strays)} unexpected: {strays[:3]}")
    return problems


# ------------------------------------------------------------------- the test -----


async def test_two_node_example_routes_to_owners_and_serves_both_nodes(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    root = copy_example(tmp_path / "scale-out")
    env = example_env(kafka_broker, mqtt_broker)
    nodes = {name: Node(name, root, env) for name in NODES}
    run = uuid.uuid4().hex[:12]
    topic = f"run{run}"
    mqtt_proc: asyncio.subprocess.Process | None = None
    try:
        for node in nodes.values():
            node.start()
        for name, node in nodes.items():
            await until(started(node), f"{name} never started", nodes)
        await until(lambda: all(neighbour_states(n) == {OTHER[name]: "active"}
                                for name, n in nodes.items()),
                    "the two nodes never became active neighbours", nodes)

        # Each node's MQ subscriber wants the stream the other node owns.
        for name, node in nodes.items():
            await subscribe(node, NODES[OTHER[name]], topic)
        await until(lambda: all(proxies_from(nodes[OTHER[name]], name, NODES[OTHER[name]], topic)
                                for name in nodes),
                    "the subscribers' proxy subscriptions never reached the owners", nodes)

        sent: dict[str, dict[str, list[bytes]]] = {s: {} for s in NODES.values()}
        for stream in NODES.values():
            for at in NODES:
                sent[stream][f"{stream} put at {at}"] = [
                    f"{run} {stream} {at} {i:04d}".encode() for i in range(PER_PUBLISHER)]
        total = 2 * 2 * PER_PUBLISHER
        mqtt_proc = await mosquitto_sub(
            mqtt_broker, [f"scale-out/{s}/{topic}" for s in NODES.values()])

        # Every publisher at both nodes at once: 4 publishers, 2 per stream.
        await asyncio.gather(*(
            publish(nodes[at], stream, topic, payloads)
            for stream in NODES.values() for (at, payloads)
            in zip(NODES, sent[stream].values(), strict=True)))

        # The non-owners' MQ subscribers (through the owners' proxies).
        got_mq = await asyncio.gather(*(
            subscriber_payloads(nodes[name], 2 * PER_PUBLISHER, SETTLE_S) for name in NODES))
        for name, got in zip(NODES, got_mq, strict=True):
            stream = NODES[OTHER[name]]
            problems = in_order_once(got, sent[stream])
            assert not problems, f"MQ subscriber at {name} ({stream}): {problems}\n{logs(nodes)}"

        # The owners' MQTT sinks.
        lines = await mqtt_lines(mqtt_proc, total, SETTLE_S)
        mqtt_proc = None
        for stream in NODES.values():
            got = [ln.split("|", 1)[1].encode() for ln in lines
                   if ln.startswith(f"scale-out/{stream}/{topic}|")]
            problems = in_order_once(got, sent[stream])
            assert not problems, f"mosquitto_sub, {stream}: {problems}\n{logs(nodes)}"
        assert len(lines) == total, lines[total:]

        # The owners' Kafka sinks (records keyed by the topic within the stream), read
        # once each owner's /metrics counts them acknowledged by Kafka.
        await until(lambda: all(kafka_acknowledged(env, name) >= 2 * PER_PUBLISHER
                                for name in nodes),
                    "the owners' Kafka sinks never had everything acknowledged", nodes)
        streams = list(NODES.values())
        all_records = await asyncio.gather(*(
            asyncio.to_thread(kafka_records, kafka_broker.bootstrap, f"scale-out.{stream}")
            for stream in streams))
        for stream, records in zip(streams, all_records, strict=True):
            got = [value.encode() for key, value in records if key == topic]
            problems = in_order_once(got, sent[stream])
            assert not problems, f"Kafka console consumer, {stream}: {problems}\n{logs(nodes)}"
    finally:
        if mqtt_proc is not None and mqtt_proc.returncode is None:
            mqtt_proc.kill()
            await mqtt_proc.wait()
        for node in nodes.values():
            node.terminate(timeout=30)
