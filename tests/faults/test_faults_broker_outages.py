"""Kafka and Mosquitto each really stopped (process stop, SIGTERM) for 30 s in the middle
of a load, then started again on the same port with the same data, while ``mqgw run``
keeps running: 0 lost on every path, and the gateway recovers by itself (issue 12
items 1 and 11). The existing outage tests freeze the brokers (SIGSTOP); these stop them.

Load: a backlog of MQ publications queued before the start (the outbound paths are in
the middle of it when the broker stops) and steady Kafka/MQTT feeds for the inbound paths
throughout. After the restart the running gateway — not a restarted one — must deliver
the whole outbound backlog; the inbound count follows a clean stop.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker
from tests.faults.clients import KafkaReader, MqttReader, SteadyFeeds
from tests.faults.ledger import Ledger, assert_nothing_lost, report
from tests.faults.scenario import (
    FaultWorld,
    first_start,
    put_publications,
    recover_and_count,
    wait_ready,
    wait_until,
)
from tests.plugins.mqtt.mqtt_harness import FixedPortMosquitto

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: How long each broker stays down (``MQGW_FAULT_OUTAGE_S`` to try others, e.g. 20).
OUTAGE_S = float(os.environ.get("MQGW_FAULT_OUTAGE_S", "30"))
BACKLOG = 3000
#: The broker stops this long after both plugin instances started (the issue's "~2 s
#: into the transfer"), or earlier once its reader has seen MID_LOAD publications; later
#: when nothing got through by then (at most READY_S: wait_ready's bound for the start).
STOP_AFTER_S = 2.0
MID_LOAD = 1000
READY_S = 60.0
#: How long the running gateway gets, after the restart, to deliver the whole backlog.
RECOVERY_S = 90.0
#: Most log lines the gateway may write while a broker is down (issue 12 item 6: the
#: client library alone wrote ~5,000 a second; the limiter keeps one line per kind, a
#: periodic summary and one "back" line, plus the gateway's own few state changes).
MAX_OUTAGE_LOG_LINES = 200


async def _outage(
    world: FaultWorld, tmp_path: Path, name: str, watched: str,
    stop_broker: Callable[[], object], start_broker: Callable[[], object],
) -> None:
    ledger = Ledger()
    # The stop must land while the 3,000 publications are still flowing. At the default
    # batch_size (256 since issue 32) a quiet machine moved them all to Kafka before the
    # reader had seen MID_LOAD and the broker was stopped; batches of 32 (the default
    # this test was written for) keep the transfer going for some seconds.
    world.broker_extra.setdefault("batch_size", 32)
    gw = world.gateway()
    kafka_reader = KafkaReader(world, ledger.paths["MQ->Kafka"])
    mqtt_reader = MqttReader(world, ledger.paths["MQ->MQTT"])
    feeds = SteadyFeeds(world, ledger)
    kafka_reader.start()
    mqtt_reader.start()
    began = stopped_at = time.monotonic()
    at_stop: dict[str, int] = {}
    recovered_running: float | None = None
    outage_log_lines = -1
    try:
        async with asyncio.timeout(30):
            await mqtt_reader.ready.wait()
        await first_start(world, gw)
        ids = [f"q-{n}" for n in range(BACKLOG)]
        await put_publications(world, ids)
        ledger.paths["MQ->Kafka"].sent.update(ids)
        ledger.paths["MQ->MQTT"].sent.update(ids)
        gw.start()
        assert await wait_ready(gw, lines=world.ready_lines), gw.log_tail()
        feeds.start()
        load_began = time.monotonic()

        def mid_load() -> bool:
            # MID_LOAD seen, or STOP_AFTER_S into the transfer once some got through: a
            # busy machine may have delivered nothing yet at STOP_AFTER_S.
            got = len(ledger.paths[watched].received)
            return got >= MID_LOAD or (got > 0 and time.monotonic() - load_began >= STOP_AFTER_S)

        await wait_until(mid_load, READY_S)
        at_stop = {name: len(p.received) for name, p in ledger.paths.items()}
        logged_before = len(gw.log_since_start().splitlines())
        stop_broker()
        stopped_at = time.monotonic()
        await asyncio.sleep(OUTAGE_S)
        outage_log_lines = len(gw.log_since_start().splitlines()) - logged_before
        start_broker()
        restarted_at = time.monotonic()
        await asyncio.sleep(5.0)  # inbound traffic after the restart too
        await feeds.close()
        outbound = (ledger.paths["MQ->Kafka"], ledger.paths["MQ->MQTT"])
        if await wait_until(lambda: all(p.complete for p in outbound), RECOVERY_S):
            recovered_running = time.monotonic() - restarted_at
        else:  # where each thread is (a producer's poll thread?) goes with the failure
            gw.dump_stacks(f"no recovery {RECOVERY_S:.0f} s after the {name} restart")
        assert gw.running, f"the gateway died during the outage:\n{gw.log_tail()}"
        # The figures say whether the running gateway recovered by itself; the clean
        # runs that follow only collect the inbound paths' messages.
        if recovered_running is not None:
            await recover_and_count(world, gw, ledger)
    finally:
        gw.kill()  # wedged: what it still holds is counted as lost, not rescued
        await feeds.close()
        await kafka_reader.close()
        await mqtt_reader.close()
    table = report(
        tmp_path / f"fault-suite-{name}-outage.json", f"fault suite: {name} stopped "
        f"{OUTAGE_S:.0f} s mid-load", ledger, 1,
        outage_s=OUTAGE_S, backlog=BACKLOG,
        stopped_after_s=round(stopped_at - began, 1), received_at_stop=at_stop,
        recovered_after_restart_s=None if recovered_running is None
        else round(recovered_running, 1),
        feed_failures=dict(feeds.failures),
        log_lines_during_outage=outage_log_lines,
    )
    assert 0 < at_stop.get(watched, 0) < BACKLOG, f"not stopped mid-load: {at_stop}"
    assert recovered_running is not None, (
        f"the running gateway did not deliver the outbound backlog within {RECOVERY_S:.0f} s "
        f"of the {name} restart\n{table}\n{gw.log_tail(60)}"
    )
    assert_nothing_lost(ledger, table)
    assert 0 <= outage_log_lines <= MAX_OUTAGE_LOG_LINES, (
        f"{outage_log_lines} log lines in {OUTAGE_S:.0f} s of {name} outage (log flood)\n"
        f"{gw.log_tail(60)}"
    )


async def test_kafka_stopped_30s_mid_load(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The session broker stopped and restarted (KafkaBroker.restart: same ports, same
    data); the plugin's request_timeout_ms is 5000, as in the issue's reproduction."""
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
                       kafka_extra={"request_timeout_ms": 5000})
    await _outage(world, tmp_path, "kafka", "MQ->Kafka", kafka_broker.stop,
                  kafka_broker.restart)


async def test_kafka_stopped_30s_mid_load_plugins_in_a_worker(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The same outage with both plugin instances in a worker process (``workers:``):
    the worker's forwarders hold their batches in open units of work on the queue
    manager's local socket and retry through the outage; the inbound instances put over
    that socket. The running gateway, worker included, delivers everything."""
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
                       kafka_extra={"request_timeout_ms": 5000}, plugins_in_worker=True)
    await _outage(world, tmp_path, "kafka-worker", "MQ->Kafka", kafka_broker.stop,
                  kafka_broker.restart)


async def test_kafka_stopped_30s_mid_load_confluent_backend(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The same outage with the kafka instance on the librdkafka backend
    (``backend: confluent``, docs/kafka-backends.md): its producer and consumer ride out
    the stop and restart, and nothing is lost."""
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
                       kafka_extra={"request_timeout_ms": 5000, "backend": "confluent"})
    await _outage(world, tmp_path, "kafka-confluent", "MQ->Kafka", kafka_broker.stop,
                  kafka_broker.restart)


async def test_mosquitto_stopped_30s_mid_load(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """A Mosquitto of its own with persistence (sessions and queued messages survive its
    restart, as a production broker's do), stopped and started on the same port."""
    mosquitto = FixedPortMosquitto(tmp_path / "mosquitto")
    mosquitto.start()
    try:
        world = FaultWorld(tmp_path, kafka_broker.bootstrap, mosquitto.host, mosquitto.port)
        await _outage(world, tmp_path, "mosquitto", "MQ->MQTT", mosquitto.stop,
                      mosquitto.start)
    finally:
        mosquitto.stop()
