"""A connected MQ application that reads one queue in the background, handing each message
to a callback, until it is closed.

Why: tests and benchmarks that count what subscribers get while faults or load run
(tests/faults/test_faults_neighbours.py, benchmarks/bench_network_20.py) need the reader
to keep its connection open across the whole run, as a real subscriber does, and to
re-raise at close whatever stopped it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, Message, MQError, OpenOption
from gateway.wire.reasons import Reason

#: Milliseconds one get waits, so a close is seen within about this long.
GET_WAIT_MS = 200


class QueueReader:
    """Reads ``queue`` of ``qm`` from :meth:`start` until :meth:`close`."""

    def __init__(self, qm: EmbeddedQueueManager, queue: str,
                 on_message: Callable[[Message], None]) -> None:
        self.qm, self.queue, self.on_message = qm, queue, on_message
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"reader:{self.queue}")

    async def _run(self) -> None:
        async with await self.qm.connect() as conn:
            h = await conn.open(self.queue, OpenOption.INPUT_SHARED)
            while not self._stop.is_set():
                try:
                    m = await h.get(GetOptions(wait_ms=GET_WAIT_MS))
                except MQError as exc:
                    if exc.reason != Reason.NO_MSG_AVAILABLE:
                        raise
                    continue
                self.on_message(m)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task  # re-raises what stopped the reader
