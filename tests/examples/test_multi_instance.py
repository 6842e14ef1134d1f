"""examples/multi-instance (docs/operations.md, "High availability") started as shipped:
two ``mqgw run --multi-instance`` processes on one configuration and data directory,
told their brokers and ports through the environment variables the file reads.

Under steady traffic on four paths (tests/support/takeover.py: MQ -> Kafka and MQ ->
MQTT from an MQ application's publications, Kafka -> MQ from a Kafka producer to an MQ
application's subscriber queue, and the request/reply route ``echo``: a Kafka requester,
an MQ echo service; the MQ applications reconnect over the local socket after each
takeover) the active instance is SIGKILLed ``TAKEOVERS`` times; each time the standby
must become active and the next message sent must arrive on every path; the killed one is
started again at once (as systemd's ``Restart=always`` does) and becomes the next standby
(or, rarely, wins the lock itself: whichever instance holds it is the active one of the
next round). Takeover time: the SIGKILL to the first message sent after it arriving, per
path. On each path every message whose send returned arrives (at least once: all four
are at-least-once, docs/operations.md "Delivery guarantees per path" and
docs/request-reply.md "Once and in order"), first arrivals in the order they were sent.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker
from tests.support.instances import mqgw_status
from tests.support.takeover import TakeoverRun, percentiles

pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.mqtt, pytest.mark.kafka]

#: SIGKILLs of the active instance: the issue's 20 (``MQGW_TAKEOVERS`` for more). A
#: takeover measured 0.5-1.5 s per path on two busy cores, a round (traffic seen on the
#: four paths, kill, takeover, the killed one back as the standby) 2.5-4 s: 20 took
#: 48-79 s (58-94 s with the brokers' start) beside other agents' tests.
TAKEOVERS = int(os.environ.get("MQGW_TAKEOVERS", "20"))


async def test_the_example_takes_over_sigkill_after_sigkill(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    run = TakeoverRun(tmp_path, kafka_broker, mqtt_broker)
    try:
        await run.run(TAKEOVERS)
        code, status = await asyncio.to_thread(mqgw_status, run.config)
        assert code == 0 and status["active"]["pid"] == run.active.pid, status
        assert [s["pid"] for s in status["standbys"]] == [run.standby.pid], status
    finally:
        await run.close()
    for p in run.paths:
        sent = p.sender.committed
        p50, p99 = percentiles(run.takeovers[p.name])
        print(f"{p.name}: {TAKEOVERS} takeovers: p50 {p50:.2f} s, p99 {p99:.2f} s; "
              f"{len(sent)} sent, {p.count - len(p.arrived)} duplicate "
              f"deliveries; {run.reborn_won} takeover(s) won by the restarted instance")
        # in order, none lost
        committed = set(sent)
        assert [i for i in p.order if i in committed] == sent, p.name
        assert p99 < 10.0, (p.name, sorted(run.takeovers[p.name]))
