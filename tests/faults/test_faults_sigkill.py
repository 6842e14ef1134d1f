"""SIGKILL the gateway at random points while all four paths carry persistent traffic;
after the last trial a clean run drains everything: 0 lost on every path, duplicates
of the at-least-once paths counted and reported (issue 12 item 11).

Each trial: put a few dozen MQ publications (gateway down: it owns the data directory
while it runs), start ``mqgw run``, produce Kafka records and MQTT messages while it
starts and runs, SIGKILL it after a random 0.2–2.0 s — counted from the spawn in a
quarter of the trials (a crash during start-up: imports, recovery, plugin connects) and
from its "started" log line in the rest (plugins starting, steady flow). The seed is
printed; rerun one with ``MQGW_FAULT_SEED=<seed>``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import aiomqtt
import pytest
from aiokafka import AIOKafkaProducer

from gateway.devstack import KafkaBroker, MosquittoBroker
from tests.faults.scenario import (
    FaultWorld,
    KafkaReader,
    Ledger,
    MqttReader,
    PathLedger,
    drain_subscriber,
    prepare_queue_manager,
    put_publications,
    regsub_answer,
    wait_until,
    write_report,
)
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.kafka, pytest.mark.mqtt]

#: Messages per path per trial (MQ publications are put between trials).
PER_TRIAL = 20
KILL_AFTER = (0.2, 2.0)
#: Share of trials whose kill is timed from the spawn (during start-up).
STARTUP_KILLS = 0.25
#: The line ``mqgw run`` logs when the queue manager and broker service are up.
STARTED = "INFO gateway.runtime.app: gateway "
#: The last of the two plugin instances' start lines (they start concurrently).
READY = ("plugin instance kafka started", "plugin instance mqtt started")


async def wait_ready(gw: GatewayProcess, timeout: float = 60) -> bool:
    """Until both plugin instances logged their start (False: it died or timed out)."""
    await wait_until(lambda: all(gw.has_logged(r) for r in READY) or not gw.running, timeout)
    return gw.running and all(gw.has_logged(r) for r in READY)


async def _feed_kafka(producer: AIOKafkaProducer, world: FaultWorld, ids: list[str],
                      ledger: PathLedger) -> None:
    for i in ids:
        await producer.send_and_wait(world.kafka_in, i.encode(), key=f"F/{i}".encode())
        ledger.sent.add(i)  # acknowledged by Kafka (acks=all): the gateway owes it to MQ
        await asyncio.sleep(0.05)


async def _feed_mqtt(client: aiomqtt.Client, world: FaultWorld, ids: list[str],
                     ledger: PathLedger) -> None:
    for i in ids:
        await client.publish(f"{world.mqtt_in_prefix}/F/{i}", i.encode(), qos=1)
        ledger.sent.add(i)  # PUBACKed: Mosquitto holds it for the gateway's session
        await asyncio.sleep(0.05)


async def test_sigkill_at_random_points_loses_nothing(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path, trials: int
) -> None:
    seed = int(os.environ.get("MQGW_FAULT_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port)
    ledger = Ledger()
    gw = world.gateway()
    await prepare_queue_manager(world)
    kafka_reader = KafkaReader(world, ledger.paths["MQ->Kafka"])
    mqtt_reader = MqttReader(world, ledger.paths["MQ->MQTT"])
    kafka_reader.start()
    mqtt_reader.start()
    started = time.monotonic()
    producer = AIOKafkaProducer(bootstrap_servers=world.bootstrap, acks="all")
    await producer.start()
    try:
        async with asyncio.timeout(30):
            await mqtt_reader.ready.wait()
        # First start: the RegSub is answered, the plugins' subscriptions, the MQTT
        # session and the Kafka consumer group exist before any traffic.
        gw.start()
        assert await wait_ready(gw), gw.log_tail()
        await asyncio.sleep(1.0)
        assert gw.terminate() == 0, gw.log_tail()
        assert await regsub_answer(world) == "ok"
        kills_while_running = after_start = 0
        async with aiomqtt.Client(world.mqtt_host, world.mqtt_port,
                                  identifier=f"{world.tag}-pub") as mqtt_pub:
            for t in range(trials):
                mq_ids = [f"q{t}-{n}" for n in range(PER_TRIAL)]
                await put_publications(world, mq_ids)
                ledger.paths["MQ->Kafka"].sent.update(mq_ids)
                ledger.paths["MQ->MQTT"].sent.update(mq_ids)
                gw.start()
                feeds = asyncio.gather(
                    _feed_kafka(producer, world, [f"k{t}-{n}" for n in range(PER_TRIAL)],
                                ledger.paths["Kafka->MQ"]),
                    _feed_mqtt(mqtt_pub, world, [f"m{t}-{n}" for n in range(PER_TRIAL)],
                               ledger.paths["MQTT->MQ"]),
                )
                if rng.random() >= STARTUP_KILLS:
                    await wait_until(lambda: gw.has_logged(STARTED) or not gw.running, 30, 0.02)
                    after_start += 1
                await asyncio.sleep(rng.uniform(*KILL_AFTER))
                kills_while_running += gw.running
                gw.kill()
                async with asyncio.timeout(30):
                    await feeds
        # Recovery: a clean run until every outbound id is out, then a clean stop and
        # the MQ subscriber queue drained (up to three rounds for the inbound paths).
        inbound = (ledger.paths["Kafka->MQ"], ledger.paths["MQTT->MQ"])
        for _round in range(4):
            gw.start()
            assert await wait_ready(gw), gw.log_tail()
            await wait_until(
                lambda: ledger.paths["MQ->Kafka"].complete and ledger.paths["MQ->MQTT"].complete,
                timeout=60,
            )
            await asyncio.sleep(5.0)  # the inbound backlog: Kafka records, MQTT session
            assert gw.terminate() == 0, gw.log_tail()
            for payload in await drain_subscriber(world):
                (inbound[0] if payload.startswith("k") else inbound[1]).receive([payload])
            if all(p.complete for p in inbound):
                break
    finally:
        gw.kill()
        await producer.stop()
        await kafka_reader.close()
        await mqtt_reader.close()
    rows = ledger.table(trials)
    elapsed = time.monotonic() - started
    write_report(tmp_path / "fault-suite-sigkill.json", rows, seed=seed, trials=trials,
                 kills_while_running=kills_while_running,
                 kills_timed_from_started_line=after_start, seconds=round(elapsed, 1))
    print(f"\nfault suite: {trials} SIGKILL trials (seed {seed}, "
          f"{kills_while_running} killed while running, {after_start} of them timed from the "
          f"started line) in {elapsed:.0f} s; "
          f"report {tmp_path / 'fault-suite-sigkill.json'}")
    print(Ledger.render(rows))
    lost = {r["path"]: ledger.paths[r["path"]].lost[:10] for r in rows if r["lost"]}
    assert not lost, f"lost (first ten ids per path): {lost}\n{Ledger.render(rows)}"
