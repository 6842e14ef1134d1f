"""Sealing what is already on the sink backlogs when the backlog key is made.

Why: the forwarder sends only messages sealed with the backlog key
(``gateway.runtime.backlog_seal``). A key is made when there is none: a new install
(empty backlogs), or the first start after an upgrade from a version without the seal
(backlogs full of unsealed messages, often because a target was down, which is when
someone upgrades). Left as they are, the upgrade would dead-letter whole backlogs
(MQRC_NOT_AUTHORIZED 2035). So before any forwarder or stream batch runs, each backlog
is turned over once: every message on it is got under syncpoint and put back with the
seal in its AccountingToken, its MQMD otherwise unchanged (MsgId, CorrelId and context
kept: MQPMO_SET_ALL_CONTEXT) but for its Priority, which becomes 0 as every backlog
message's is (``SinkBacklogs.put_of``): a message put back at its old, higher priority
would be got again at once, and at one priority the queue is FIFO. Turning over exactly
the queue's depth keeps the order. Units of work of :data:`CHUNK` messages keep within
the queue manager's MaxUncommittedMsgs; a full queue is turned over too (what a unit of
work got does not count against MAXDEPTH for its own puts: IBM MQ's CURDEPTH drops a
message at the get, the embedded queue manager leaves it out of the check). Only port
verbs are used (open, inquire, get, browse, put, commit): the embedded queue manager
and IBM MQ alike.

A start cut short midway: the committed chunks are sealed and at the tail, the rest
unsealed at the head, and the key is still the one the start made
(``backlog.key.new``, kept under its real name only after all backlogs are sealed). A
second full turn would keep that rotated order for good, so the next start
(``resuming``) moves only the unsealed head: it looks at the first message (a browse)
and stops at the first one sealed with the key, which restores the original order.
Sealing a message that is already sealed is harmless either way.

What it trusts: everything on the backlogs when the key is made, as the version without
the seal did (docs/security.md, "The sink backlog queues").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

from gateway.mq.port import (
    Browse,
    Connection,
    GetOptions,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueManager,
)
from gateway.runtime.backlog_seal import BacklogSeal
from gateway.wire.reasons import Reason

__all__ = ["CHUNK", "seal_in_place"]

log = logging.getLogger(__name__)

#: Messages turned over per unit of work (each is one get and one put: 200 uncommitted).
CHUNK = 100


async def seal_in_place(
    qm: QueueManager, queues: Iterable[str], seal: BacklogSeal, *, resuming: bool
) -> dict[str, int]:
    """Seal every message on the backlog ``queues`` with ``seal`` in place (see module
    docstring); how many were sealed per queue. A queue that does not exist has nothing
    to seal. ``resuming``: the key was made by a start cut short, so only the unsealed
    head of each queue is turned over. MQError when a queue cannot be read or written
    (the start fails: nothing is forwarded unsealed)."""
    sealed: dict[str, int] = {}
    for queue in queues:
        conn = await qm.connect()
        try:
            sealed[queue] = await _seal_queue(conn, queue, seal, resuming)
        finally:
            with contextlib.suppress(MQError):
                await conn.backout()
            with contextlib.suppress(MQError):
                await conn.disconnect()
    return sealed


async def _seal_queue(conn: Connection, queue: str, seal: BacklogSeal, resuming: bool) -> int:
    options = OpenOption.INPUT_SHARED | OpenOption.INQUIRE
    if resuming:
        options |= OpenOption.BROWSE
    try:
        source = await conn.open(queue, options)
    except MQError as exc:
        if exc.reason == Reason.UNKNOWN_OBJECT_NAME:
            return 0  # not defined (IBM MQ: the start names the DEFINE): nothing on it
        raise
    target = await conn.open(queue, OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
    depth = int((await source.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH])
    put = PutOptions(syncpoint=True, set_all_context=True)
    done = in_unit = 0
    for _ in range(depth):
        get = GetOptions(syncpoint=True)
        if resuming:
            try:
                head = await source.get(GetOptions(browse=Browse.FIRST))
            except MQError as exc:
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    raise
                break
            if seal.sealed(head.md, head.body):
                break  # the start cut short had turned over the rest
            get = GetOptions(syncpoint=True, match_msg_id=head.md.msg_id)
        try:
            m = await source.get(get)
        except MQError as exc:
            if exc.reason != Reason.NO_MSG_AVAILABLE:
                raise
            break
        md = m.md
        md.accounting_token = seal.seal(m.body)
        md.priority = 0
        await target.put(md, m.body, put)
        done += 1
        in_unit += 1
        if in_unit >= CHUNK:
            await conn.commit()
            in_unit = 0
    await conn.commit()
    with contextlib.suppress(MQError):
        await source.close()
    with contextlib.suppress(MQError):
        await target.close()
    return done
