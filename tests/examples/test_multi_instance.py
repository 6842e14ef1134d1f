"""examples/multi-instance (docs/operations.md, "High availability") started as shipped:
two ``mqgw run --multi-instance`` processes on one configuration and data directory,
told their brokers and ports through the environment variables the file reads.

Under steady traffic (an MQ application putting one MQRFH publication at a time over the
active instance's local socket, reconnecting after each takeover) the active instance is
SIGKILLed ``TAKEOVERS`` times; each time the standby must become active and the next
publication must reach an MQTT subscriber, and a new standby is started in place of the
killed one. Takeover time: the SIGKILL to the first publication put after it arriving.
Every publication whose commit returned arrives (at least once: MQ -> MQTT is
at-least-once, docs/mqtt-plugin.md), first arrivals in the order they were put.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import time
from pathlib import Path

import aiomqtt
import pytest

from gateway.devstack import MosquittoBroker
from gateway.devstack.ports import free_ports
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import OpenOption, PutOptions
from tests.support.instances import Instance, mqgw_status
from tests.support.names import unique
from tests.support.pubsub_messages import rfh_message

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.mqtt]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi-instance"
STREAM = "STOCK.STREAM"
#: SIGKILLs of the active instance. One takeover measured 1.5-3 s on two busy cores, a
#: round (kill, takeover, a new standby up) 2-4 s: 20 (the issue's count) keep it under 90 s.
TAKEOVERS = 20
#: Bound on one takeover / one start (the issue's goal is p99 < 10 s; this is a hang).
TAKEOVER_S = 60.0
#: Seconds between the publisher's puts.
PUT_EVERY_S = 0.05


class Publisher:
    """Puts publication ``p<n>`` after ``p<n-1>``'s commit returned (or failed: then
    ``p<n>`` again, on a new connection), recording when each was put."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.put_at: dict[str, float] = {}
        self.committed: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                conn = await connect_local(self.data_dir, appl_name="ha publisher")
            except Exception:
                await asyncio.sleep(0.05)
                continue
            try:
                handle = await conn.open(STREAM, OpenOption.OUTPUT)
                while not self.stop.is_set():
                    ident = f"p{n:06d}"
                    msg = rfh_message(STREAM, [("MQPSCommand", "Publish"),
                                               ("MQPSStreamName", STREAM),
                                               ("MQPSTopic", f"HA/{ident}")], ident.encode())
                    self.put_at.setdefault(ident, time.monotonic())
                    await handle.put(msg.md, msg.body, PutOptions(syncpoint=True))
                    await conn.commit()
                    self.committed.append(ident)
                    n += 1
                    await asyncio.sleep(PUT_EVERY_S)
            except Exception:  # the instance died under us: the same id again
                await asyncio.sleep(0.05)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.disconnect(), 2)


class Subscriber:
    """A QoS 1 MQTT subscriber to the example's outbound topics: first arrival times."""

    def __init__(self, broker: MosquittoBroker, prefix: str) -> None:
        self.broker = broker
        self.filter = f"{prefix}/{STREAM}/#"
        self.arrived: dict[str, float] = {}
        self.order: list[str] = []
        self.count = 0
        self.ready = asyncio.Event()

    async def run(self) -> None:
        async with aiomqtt.Client(self.broker.host, self.broker.port,
                                  identifier=unique("ha-sub-"), keepalive=10) as client:
            await client.subscribe(self.filter, qos=1)
            self.ready.set()
            async for msg in client.messages:
                if isinstance(msg.payload, bytes | bytearray):
                    ident = bytes(msg.payload).decode("utf-8", "replace")
                    self.count += 1
                    if ident not in self.arrived:
                        self.arrived[ident] = time.monotonic()
                        self.order.append(ident)


async def _until(instance: Instance, what: str, check: object, timeout: float) -> float:
    return await asyncio.to_thread(instance.wait_for, what, check, timeout)


async def test_the_example_takes_over_sigkill_after_sigkill(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    root = tmp_path / "multi-instance"
    shutil.copytree(EXAMPLE, root)
    config = root / "gateway.yaml"
    listener, port_a, port_b = free_ports(3)
    prefix = unique("ha")
    env = {"MQGW_MQTT_HOST": mqtt_broker.host, "MQGW_MQTT_PORT": str(mqtt_broker.port),
           "MQGW_LISTENER_PORT": str(listener), "MQGW_MQTT_PREFIX": prefix}
    ports = [port_a, port_b]
    active = Instance("i0", config, ports[0], env)
    standby = Instance("i1", config, ports[1], env)
    everyone = [active, standby]
    subscriber = Subscriber(mqtt_broker, prefix)
    publisher = Publisher(root / "data" / "qm")
    tasks = [asyncio.create_task(subscriber.run())]
    takeovers: list[float] = []
    try:
        await asyncio.wait_for(subscriber.ready.wait(), 30)
        active.start()
        await _until(active, "active", lambda: active.has_logged("plugin instance mqtt started")
                     and active.role() == "active", TAKEOVER_S)
        standby.start()
        await _until(standby, "standby", lambda: standby.role() == "standby", TAKEOVER_S)
        tasks.append(asyncio.create_task(publisher.run()))
        for round_ in range(TAKEOVERS):
            # traffic flows through the active instance before each kill
            mark = len(publisher.committed)
            await _until(active, "traffic", lambda m=mark: len(publisher.committed) > m + 3
                         and publisher.committed[m + 3] in subscriber.arrived, TAKEOVER_S)
            killed_at = time.monotonic()
            active.kill()
            await _until(standby, "the first publication after the takeover", lambda t=killed_at:
                         any(at > t and i in subscriber.arrived
                             for i, at in list(publisher.put_at.items())[-50:]), TAKEOVER_S)
            first = min(subscriber.arrived[i] for i, at in publisher.put_at.items()
                        if at > killed_at and i in subscriber.arrived)
            takeovers.append(first - killed_at)
            assert standby.role() == "active", standby.log_tail()
            # a new standby where the killed one ran (its metrics port, its name's log)
            ports.reverse()
            active, standby = standby, Instance(f"i{round_ + 2}", config, ports[1], env)
            everyone.append(standby)
            standby.start()
            await _until(standby, "standby", lambda s=standby: s.role() == "standby",
                         TAKEOVER_S)
        code, status = await asyncio.to_thread(mqgw_status, config)
        assert code == 0 and status["active"]["pid"] == active.pid, status
        assert [s["pid"] for s in status["standbys"]] == [standby.pid], status
        publisher.stop.set()
        await asyncio.wait_for(tasks[1], 10)
        sent = list(publisher.committed)
        await _until(active, "every publication", lambda: all(
            i in subscriber.arrived for i in sent), TAKEOVER_S)
    finally:
        publisher.stop.set()
        for instance in everyone:
            if instance.running:
                await asyncio.to_thread(instance.terminate)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    ordered = sorted(takeovers)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"{TAKEOVERS} takeovers: p50 {p50:.2f} s, p99 {p99:.2f} s, max {ordered[-1]:.2f} "
          f"s; {len(sent)} publications, {subscriber.count - len(subscriber.arrived)} "
          "duplicate deliveries")
    assert [i for i in subscriber.order if i in set(sent)] == sent  # in order, none lost
    assert p99 < 10.0, ordered
