"""The repository kept as one persistent message on SYSTEM.CLUSTER.REPOSITORY.QUEUE.

Why a message and not a file: it is replaced in the same unit of work that consumes a
repository command, so the repository and the commands applied to it survive a crash
together (docs/networks.md, Clusters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.mq.embedded.objects import CLUSTER_REPOSITORY_QUEUE
from gateway.mq.embedded.repository import Repository
from gateway.mq.port import Browse, GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

if TYPE_CHECKING:
    from gateway.mq.embedded.connection import EmbeddedConnection
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager


async def save_repository(conn: EmbeddedConnection, repository: Repository) -> None:
    """Replace the repository message under ``conn``'s unit of work (the caller commits)."""
    q = await conn.open(CLUSTER_REPOSITORY_QUEUE, OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
    try:
        while True:
            try:
                await q.get(GetOptions(wait_ms=0, syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
        md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
        await q.put(md, repository.encode(), PutOptions(syncpoint=True))
    finally:
        await q.close()


async def load_repository(qm: EmbeddedQueueManager) -> Repository | None:
    """The stored repository (the last message of the queue), or None."""
    conn = await qm.connect()
    try:
        q = await conn.open(CLUSTER_REPOSITORY_QUEUE, OpenOption.BROWSE)
        last: bytes | None = None
        browse = Browse.FIRST
        while True:
            try:
                msg = await q.get(GetOptions(browse=browse))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            last = msg.body
            browse = Browse.NEXT
        return Repository.decode(last) if last is not None else None
    finally:
        await conn.disconnect()
