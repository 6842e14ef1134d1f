"""A hand-written MQ -> X bridge: the baseline a user would write instead of the gateway.

Issue 16's rationale is that choosing the gateway over a hand-written aiokafka/paho
bridge should cost nothing. The goal rows compare the gateway with a raw producer alone
(no MQ get, no commit); this module is what a user actually compares with: a plain loop
over the public APIs, doing the minimum that the same guarantee (at-least-once) needs:

1. get up to ``batch`` messages from the stream queue under syncpoint (the embedded
   queue manager's handle, ``get_batch``: one unit of work per batch);
2. parse what it must: the MQRFH2 (with ``gateway.wire``'s public codec, as a user
   would use a library for it) to find the publication's topic;
3. hand each message to the client (``send``: the raw aiokafka producer or aiomqtt);
4. wait for every acknowledgement of the batch;
5. commit the MQ unit of work (a failure before it backs the batch out: re-sent later).

No subscriptions, no topic matching (one stream, every topic goes through), no
retained publications, no dead-letter or backout-queue handling, no metadata beyond
what the raw baseline carries: a lower bound of what a hand-written bridge costs.
Shared by bench_bridge_kafka and bench_bridge_mqtt (one loop, two clients).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.chain import parse_message
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.rfh2 import MQRFH2

#: ``send(topic, message, rfh2, payload)``: hands one message to the client and returns
#: what to await for its acknowledgement (a future, or a coroutine that waits for it).
Send = Callable[[str, Message, MQRFH2, bytes], Awaitable[Awaitable[object]]]


@dataclass(slots=True)
class HandRun:
    """One timed hand-written bridge run: messages committed, wall seconds, process CPU
    seconds (every thread: the queue manager's writer too) and the event-loop thread's
    CPU seconds over the same window, and the number of MQ units of work."""

    sent: int
    seconds: float
    cpu: float
    loop_cpu: float
    batches: int

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


async def preload(
    qm: EmbeddedQueueManager, stream: str, n: int, publication: Callable[[int], tuple[MQMD, bytes]]
) -> None:
    """Put ``n`` publications on ``stream`` (units of 500), as the gateway runs get."""
    conn = await qm.connect()
    opts = PutOptions(syncpoint=True)
    for i in range(n):
        md, body = publication(i)
        await conn.put1(stream, md, body, opts)
        if i % 500 == 499:
            await conn.commit()
    await conn.commit()
    await conn.disconnect()


async def run(
    qm: EmbeddedQueueManager,
    stream: str,
    n: int,
    batch: int,
    send: Send,
    *,
    time_limit: float,
    wait_ms: int = 100,
    on_start: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> HandRun:
    """Bridge ``n`` messages of ``stream`` through ``send``; timed from the first get to
    the last commit (``on_start``/``on_stop`` are called as the timing starts and ends:
    a profiler's switch)."""
    prefix = f"$SYS/STREAM/{stream}/"
    conn = await qm.connect()
    try:
        handle = await conn.open(stream, OpenOption.INPUT_SHARED | OpenOption.FAIL_IF_QUIESCING)
        options = GetOptions(wait_ms=wait_ms, syncpoint=True)
        sent = batches = 0
        if on_start is not None:
            on_start()
        started, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        deadline = started + time_limit
        while sent < n and time.perf_counter() < deadline:
            try:
                got = await handle.get_batch(options, batch)
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    continue
                raise
            try:
                acks = []
                for m in got:
                    parsed = parse_message(m.md, m.body, depth=1)
                    rfh2 = parsed.headers[0]
                    if not isinstance(rfh2, MQRFH2):
                        raise ValueError(f"not an MQRFH2 publication: {m.md.format!r}")
                    topic = rfh2.get("psc", "Topic") or ""
                    acks.append(await send(topic.removeprefix(prefix), m, rfh2, parsed.payload))
                await asyncio.gather(*acks)
            except BaseException:
                await conn.backout()  # at-least-once: the batch goes back on the queue
                raise
            await conn.commit()
            sent += len(got)
            batches += 1
        took = time.perf_counter() - started
        cpu = time.process_time() - cpu
        loop_cpu = time.thread_time() - loop_cpu
        if on_stop is not None:
            on_stop()
        await handle.close()
    finally:
        await conn.disconnect()
    return HandRun(sent, took, cpu, loop_cpu, batches)
