"""The MsgId/CorrelId indexes of the embedded queue manager's local queues (issue 32).

A fan-out queues thousands of messages per unit of work, each with a MsgId of its own:
an identifier held by one message must cost no object of its own (a set per message was
a third of the objects a queued fan-out kept for the garbage collector to walk), and
matching gets must find exactly the messages holding an identifier, however many share
it, in get order, before and after gets, backouts and a restart.
"""

from __future__ import annotations

import gc
from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.queues import LocalQueue, QueuedMessage
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


def test_a_message_with_its_own_ids_adds_no_object_to_the_index() -> None:
    q = LocalQueue("Q")
    count = 2000
    msgs = [
        QueuedMessage(i, MQMD(msg_id=b"M" + i.to_bytes(23, "big"),
                              correl_id=b"C" + (i % 4).to_bytes(23, "big")),
                      b"x", 0, True, 0.0, None)
        for i in range(count)
    ]
    gc.collect()
    before = len(gc.get_objects())
    for m in msgs:
        q.add(m)
    gc.collect()
    added = len(gc.get_objects()) - before
    # the 4 CorrelIds shared by 500 messages each are 4 sets; the 2,000 MsgIds none
    assert added <= 10, added
    for m in msgs[:1000]:
        q.remove(m)
    assert len(q.by_msg_id) == 1000
    assert all(len(seqs) == 250 for seqs in q.by_correl_id.values()
               if not isinstance(seqs, int))


async def test_matching_gets_find_shared_and_single_ids(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    for r in qm.run_mqsc("DEFINE QLOCAL(Q1) REPLACE"):
        assert r.ok, r.text
    same, other = b"SAME".ljust(24, b"\0"), b"OTHER".ljust(24, b"\0")
    conn = await qm.connect()
    q = await conn.open("Q1", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    # bodies 0..5: MsgId SAME for 0, 2, 4; CorrelId OTHER for 1 and 2; 3 and 5 unique
    for i in range(6):
        md = MQMD(persistence=Persistence.PERSISTENT,
                  msg_id=same if i % 2 == 0 else b"",
                  correl_id=other if i in (1, 2) else bytes([i]) * 24)
        await q.put(md, b"%d" % i, PutOptions(syncpoint=True))
    await conn.commit()

    async def bodies(match: GetOptions) -> list[bytes]:
        got = []
        while True:
            try:
                got.append((await q.get(match)).body)
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return got

    # a got message returns with a backout: the indexes take it back
    first = await q.get(GetOptions(syncpoint=True, match_correl_id=other))
    assert first.body == b"1"
    await conn.backout()
    assert await bodies(GetOptions(match_correl_id=other, match_msg_id=same)) == [b"2"]
    assert await bodies(GetOptions(match_msg_id=same)) == [b"0", b"4"]
    await q.close()
    await conn.disconnect()
    await qm.close()
    # after a restart the indexes are rebuilt from the store
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    conn = await qm.connect()
    q = await conn.open("Q1", OpenOption.INPUT_SHARED)
    assert await bodies(GetOptions(match_correl_id=other)) == [b"1"]
    assert await bodies(GetOptions(match_correl_id=bytes([5]) * 24)) == [b"5"]
    assert await bodies(GetOptions(match_msg_id=same)) == []
    assert await bodies(GetOptions()) == [b"3"]
    await q.close()
    await conn.disconnect()
    await qm.close()
