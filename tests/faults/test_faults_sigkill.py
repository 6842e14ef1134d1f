"""SIGKILL the gateway at random points while all four paths carry persistent traffic,
the outbound stream also through an exactly-once kafka instance; after the last trial a
clean run drains everything: 0 lost on every path, 0 duplicated on the exactly-once
path, duplicates of the at-least-once paths counted and reported (issue 12 item 11).

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
from tests.faults.clients import KafkaReader, MqttReader
from tests.faults.ledger import (
    EXACTLY_ONCE_PATH,
    Ledger,
    PathLedger,
    assert_nothing_duplicated,
    assert_nothing_lost,
    report,
)
from tests.faults.scenario import (
    STARTED,
    FaultWorld,
    first_start,
    put_publications,
    recover_and_count,
    wait_until,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.kafka, pytest.mark.mqtt]

#: Messages per path per trial (MQ publications are put between trials).
PER_TRIAL = 20
KILL_AFTER = (0.2, 2.0)
#: Share of trials whose kill is timed from the spawn (during start-up).
STARTUP_KILLS = 0.25


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
    world = FaultWorld(tmp_path, kafka_broker.bootstrap, mqtt_broker.host, mqtt_broker.port,
                       exactly_once=True)
    ledger = Ledger.with_exactly_once()
    gw = world.gateway()
    kafka_reader = KafkaReader(world, ledger.paths["MQ->Kafka"])
    eos_reader = KafkaReader(world, ledger.paths[EXACTLY_ONCE_PATH], world.kafka_eos_out,
                             read_committed=True)
    mqtt_reader = MqttReader(world, ledger.paths["MQ->MQTT"])
    kafka_reader.start()
    eos_reader.start()
    mqtt_reader.start()
    started = time.monotonic()
    producer = AIOKafkaProducer(bootstrap_servers=world.bootstrap, acks="all")
    await producer.start()
    try:
        async with asyncio.timeout(30):
            await mqtt_reader.ready.wait()
        await first_start(world, gw)
        kills_while_running = after_start = 0
        async with aiomqtt.Client(world.mqtt_host, world.mqtt_port,
                                  identifier=f"{world.tag}-pub") as mqtt_pub:
            for t in range(trials):
                mq_ids = [f"q{t}-{n}" for n in range(PER_TRIAL)]
                await put_publications(world, mq_ids)
                ledger.paths["MQ->Kafka"].sent.update(mq_ids)
                ledger.paths["MQ->MQTT"].sent.update(mq_ids)
                ledger.paths[EXACTLY_ONCE_PATH].sent.update(mq_ids)
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
        # Recovery: clean runs until everything is out, then count.
        await recover_and_count(world, gw, ledger)
    finally:
        gw.kill()
        await producer.stop()
        await kafka_reader.close()
        await eos_reader.close()
        await mqtt_reader.close()
    table = report(
        tmp_path / "fault-suite-sigkill.json", f"fault suite: {trials} SIGKILL trials", ledger,
        trials, seed=seed, killed_while_running=kills_while_running,
        kills_timed_from_started_line=after_start,
        seconds=round(time.monotonic() - started, 1),
    )
    assert_nothing_lost(ledger, table)
    assert_nothing_duplicated(ledger.paths[EXACTLY_ONCE_PATH], table)
