"""The fault suite's hostile-input section for request/reply (issue 29): outside parties
who make the gateway hold, resend or log something at will, against a real ``mqgw run``
process.

* MQTT 5 requesters whose Response Topic the broker refuses the gateway (an ACL denies
  it: Mosquitto answers the PUBLISH with PUBACK 0x87, "not authorised"): 100 of them
  must not stop the timeout of an honest requester on the same route; each error reply
  is refused for its own topic (never retried while the others wait) and counted, with
  a handful of log lines. (A ``$SYS/...`` Response Topic, which Mosquitto refuses too,
  is refused by the gateway at intake: tests/faults/test_hostile_destinations.py.)
* A hostile MQ application flooding the reply queue and a service queue with junk
  through the embedded queue manager's local socket: every message dead-lettered with
  its MQDLH reason and counted, a handful of log lines.

Bounded and event-driven (each wait polls for its condition with a bound), so it runs in
``make test``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import MosquittoBroker, MosquittoOptions
from gateway.devstack.ports import free_port
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import GetOptions, OpenOption, PutOptions, QueueAttr
from gateway.wire.constants import MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.names import unique

pytestmark = [pytest.mark.faults]

QM = "HOSTILE"
STARTED = f"gateway mqgw-{QM} started"
START_S = 60.0
#: MQFB_APPL_FIRST + 1: the MQDLH reason of a reply no request waits for.
NO_PENDING_REQUEST = 65537
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        body: dict[str, Any] = json.loads(r.read())
        return body


def rr_stats(port: int) -> dict[str, int]:
    try:
        stats = healthz(port).get("request_reply") or {}
    except OSError:
        return {}
    return {str(k): int(v) for k, v in stats.items()}


async def until(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Poll ``check`` (in a thread: it may do I/O) until true; the seconds it took."""
    start = time.monotonic()
    while not await asyncio.to_thread(check):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - start


@contextlib.contextmanager
def running_gateway(work: Path, config: dict[str, Any]) -> Iterator[GatewayProcess]:
    """``mqgw run`` on ``config`` until the block ends (SIGTERM: its summaries flush)."""
    gw = GatewayProcess(write_config(work / "gateway.yaml", config), work / "gateway.log")
    gw.start()
    try:
        deadline = time.monotonic() + START_S
        while not gw.has_logged(STARTED):
            assert gw.running, gw.log_tail()
            assert time.monotonic() < deadline, gw.log_tail()
            time.sleep(0.05)
        yield gw
    finally:
        if gw.running:
            gw.terminate(timeout=30)


def lines_with(gw: GatewayProcess, *texts: str) -> list[str]:
    return [line for line in gw.log_since_start().splitlines()
            if any(t in line for t in texts)]


def base_config(work: Path, metrics_port: int, mqsc: str) -> dict[str, Any]:
    (work / "queues.mqsc").write_text(mqsc, encoding="utf-8")
    return {
        "queue_manager": {"name": QM, "data_dir": "qm", "mqsc_file": "queues.mqsc"},
        "broker": {"store": "pubsub.db"},
        "metrics": {"host": "127.0.0.1", "port": metrics_port, "dashboard": False},
        "logging": {"format": "json", "level": "info"},
    }


# --------------------------------------------------- Response Topics the broker refuses


STUCK = 100  # the store's due() returned the oldest 100: exactly enough to stop it


async def route_subscribed(client: aiomqtt.Client, topic: str, reply_topic: str,
                           port: int) -> int:
    """Send probe requests (one a second) until the gateway has sent one to MQ: its
    route's subscription is in place (the plugin starts after the gateway says
    "started"). How many it had sent then (a probe sent before may still come: each
    is a request of its own, answered by its own timeout error reply)."""
    deadline = time.monotonic() + START_S
    n = 0
    while True:
        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        props.ResponseTopic = reply_topic
        props.CorrelationData = b"probe-%d" % n
        await client.publish(topic, b"probe", qos=1, properties=props)
        n += 1
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            sent = (await asyncio.to_thread(rr_stats, port)).get("requests_sent", 0)
            if sent:
                return sent
            await asyncio.sleep(0.05)
        assert time.monotonic() < deadline, "the gateway never took a request"


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A Mosquitto of its own whose ACL denies every client the topics ``denied/#``."""
    broker = MosquittoBroker(
        tmp_path / "mosquitto",
        MosquittoOptions(acl=("topic readwrite #", "topic deny denied/#")),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def test_requests_whose_response_topic_the_broker_refuses_do_not_stop_timeouts(
    tmp_path: Path, acl_broker: MosquittoBroker
) -> None:
    mqtt_broker = acl_broker
    base = unique("hostile")
    port = free_port()
    config = base_config(tmp_path, port, "DEFINE QLOCAL(SVC.NOBODY) MAXDEPTH(10000)\n")
    config["plugins"] = [{"name": "mqtt", "plugin": "mqtt", "config": {
        "host": mqtt_broker.host, "port": mqtt_broker.port, "protocol": "5",
        "client_id": unique("hostile-gw-")}}]
    config["request_reply"] = {
        "store": "rr.db", "sweep_interval": 0.25, "undeliverable_after": 4.0,
        "requests": [{"name": "quote", "plugin": "mqtt", "source": f"{base}/req/#",
                      "destination": "SVC.NOBODY", "timeout": 1.0}],
    }
    with running_gateway(tmp_path, config) as gw:
        async with aiomqtt.Client(mqtt_broker.host, mqtt_broker.port,
                                  identifier=unique("hostile-req-"),
                                  protocol=aiomqtt.ProtocolVersion.V5) as client:
            await client.subscribe(f"{base}/good", qos=1)
            probes = await route_subscribed(client, f"{base}/req/x", f"{base}/probe", port)
            for i in range(STUCK):
                props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                props.ResponseTopic = f"denied/{base}/r"  # the ACL refuses us: 0x87
                props.CorrelationData = b"bad-%d" % i
                await client.publish(f"{base}/req/x", b"?", qos=1, properties=props)
            await until("the hostile requests sent",
                        lambda: rr_stats(port).get("requests_sent", 0) >= probes + STUCK, 60)
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            props.ResponseTopic = f"{base}/good"
            props.CorrelationData = b"honest"
            sent = time.monotonic()
            await client.publish(f"{base}/req/x", b"?", qos=1, properties=props)
            async with asyncio.timeout(15):  # its deadline is 1 s away
                message = await anext(aiter(client.messages))
            waited = time.monotonic() - sent
            assert isinstance(message.payload, bytes)
            assert json.loads(message.payload)["error"] == "timeout"
            assert getattr(message.properties, "CorrelationData", None) == b"honest"
        took = await until(
            "the hostile entries finished",
            lambda: rr_stats(port).get("error_replies_undeliverable") == STUCK, 30)
        stats = rr_stats(port)
        # every request timed out; all but the hostile ones got their error reply, whose
        # topics the broker refused (each once: a refusal, not a retry)
        assert stats["requester_open"] == 0
        assert stats["timeouts"] == stats["requests_sent"]
        assert stats["error_replies.timeout"] == stats["requests_sent"] - STUCK
        assert gw.terminate(timeout=30) == 0  # a clean stop writes the summaries
    sweep_lines = lines_with(gw, "request/reply sweep", "error reply to")
    assert len(sweep_lines) <= 6, sweep_lines
    print(f"honest timeout error reply after {waited:.2f} s (route timeout 1 s); "
          f"{STUCK} hostile entries finished {took:.1f} s later; "
          f"{len(sweep_lines)} sweep log lines")


# --------------------------------------------------- junk on the reply and service queues


REPLY_JUNK = 3000
SERVICE_JUNK = 1000


async def put_junk(data_dir: Path, queue: str, count: int,
                   message: Callable[[int], tuple[MQMD, bytes]]) -> None:
    """A hostile MQ application (the local socket, this process's user) puts ``count``
    messages on ``queue``, 500 per unit of work."""
    conn = await connect_local(data_dir, appl_name="hostile")
    try:
        q = await conn.open(queue, OpenOption.OUTPUT)
        for i in range(count):
            md, body = message(i)
            await q.put(md, body, PutOptions(syncpoint=True, new_msg_id=True))
            if i % 500 == 499:
                await conn.commit()
        await conn.commit()
        await q.close()
    finally:
        await conn.disconnect()


def reply_junk(i: int) -> tuple[MQMD, bytes]:
    """Replies and reports nobody asked for, some with an MQRFH2 that does not parse."""
    correl = os.urandom(24)
    kind = i % 3
    if kind == 0:
        return MQMD(msg_type=MsgType.REPLY, format="MQSTR", correl_id=correl), b"junk"
    if kind == 1:
        return MQMD(msg_type=MsgType.REPORT, feedback=258, correl_id=correl), b""
    return MQMD(msg_type=MsgType.REPLY, format="MQHRF2", correl_id=correl), b"RFH \x00garbage"


def service_junk(i: int) -> tuple[MQMD, bytes]:
    """Requests whose MQRFH2 does not parse."""
    return (MQMD(msg_type=MsgType.REQUEST, format="MQHRF2", reply_to_q="APP.REPLY"),
            b"RFH \x00\x00\x00\x02" + os.urandom(16))


async def depth(data_dir: Path, queue: str) -> int:
    conn = await connect_local(data_dir, appl_name="hostile")
    try:
        q = await conn.open(queue, OpenOption.INQUIRE)
        attrs = await q.inquire(QueueAttr.CURRENT_Q_DEPTH)
        await q.close()
        return int(attrs[QueueAttr.CURRENT_Q_DEPTH])
    finally:
        await conn.disconnect()


async def test_a_junk_flood_on_the_reply_and_service_queues_is_dead_lettered_and_summarised(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = base_config(tmp_path, port, "DEFINE QLOCAL(GW.SVC) MAXDEPTH(10000)\n"
                         "DEFINE QLOCAL(SVC.Q)\n"
                         f"ALTER QLOCAL({DLQ}) MAXDEPTH(100000)\n")
    config["plugins"] = [{"name": "mem", "plugin": "memory",
                          "config": {"bus": unique("junk")}}]
    config["request_reply"] = {
        "store": "rr.db",
        "requests": [{"name": "quote", "plugin": "mem", "source": "q/req",
                      "destination": "SVC.Q"}],
        "services": [{"name": "pricing", "queue": "GW.SVC", "plugin": "mem",
                      "target": "p/req", "replies": "p/rep"}],
    }
    data_dir = tmp_path / "qm"
    with running_gateway(tmp_path, config) as gw:
        start = time.monotonic()
        await asyncio.gather(
            put_junk(data_dir, "MQGW.REPLY", REPLY_JUNK, reply_junk),
            put_junk(data_dir, "GW.SVC", SERVICE_JUNK, service_junk),
        )

        def all_handled() -> bool:
            s = rr_stats(port)
            return (s.get("replies_unmatched") == REPLY_JUNK
                    and s.get("service_requests_refused") == SERVICE_JUNK)

        await until("the junk handled", all_handled, 120)
        took = time.monotonic() - start
        assert await depth(data_dir, DLQ) == REPLY_JUNK + SERVICE_JUNK
        assert await depth(data_dir, "MQGW.REPLY") == 0
        assert await depth(data_dir, "GW.SVC") == 0
        # every dead letter carries the queue it came from and its reason
        conn = await connect_local(data_dir, appl_name="hostile")
        try:
            q = await conn.open(DLQ, OpenOption.INPUT_SHARED)
            reasons: dict[str, set[int]] = {}
            for _ in range(REPLY_JUNK + SERVICE_JUNK):
                m = await q.get(GetOptions())
                dlh, _, _ = unwrap_from_dlq(m.md, m.body)
                reasons.setdefault(dlh.dest_q_name.strip(), set()).add(dlh.reason)
            await q.close()
        finally:
            await conn.disconnect()
        assert reasons["MQGW.REPLY"] == {NO_PENDING_REQUEST}
        assert len(reasons["GW.SVC"]) == 1 and 0 not in reasons["GW.SVC"]
        assert gw.terminate(timeout=30) == 0  # a clean stop writes the summaries
    reply_lines = lines_with(gw, "matches no request", "(reply unmatched)")
    service_lines = lines_with(gw, "does not parse", "(unparsable request")
    assert len(reply_lines) <= 3, reply_lines[:5]
    assert len(service_lines) <= 3, service_lines[:5]
    assert any(f"{REPLY_JUNK - 1} more like this" in line for line in reply_lines), reply_lines
    print(f"{REPLY_JUNK} + {SERVICE_JUNK} junk messages handled in {took:.1f} s; "
          f"{len(reply_lines)} + {len(service_lines)} log lines")
