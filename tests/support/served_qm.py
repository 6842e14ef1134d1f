"""An embedded queue manager served on its local socket, for tests of the local protocol:
one set-up instead of a copy per test (define the queues, start the server, stop both)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager


@contextlib.asynccontextmanager
async def served_queue_manager(
    directory: Path, mqsc: str, name: str = "QMB"
) -> AsyncIterator[EmbeddedQueueManager]:
    """``name`` in ``directory`` with ``mqsc`` run (stopping on an error), served on its
    socket until the block ends; then the server stops and the queue manager closes."""
    qm = EmbeddedQueueManager(name, directory)
    qm.run_mqsc(mqsc, stop_on_error=True)
    server = QueueManagerServer(qm)
    await server.start()
    try:
        yield qm
    finally:
        await server.stop()
        await qm.close()
