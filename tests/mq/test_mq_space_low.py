"""The embedded queue manager's connections say when a 2056 is the whole disk's (the
free-space watermark, gateway/mq/embedded/space.py), which IBM MQ's per-queue 2056
(a queue file at MAXFSIZE) never is: the publish/subscribe service holds a batch back
for the one and dead-letters a subscriber's copy for the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.space import SpacePolicy
from gateway.mq.port import MQError, PutOptions
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


async def test_a_put_refused_at_the_watermark_is_the_disks_until_the_unit_ends(
    tmp_path: Path,
) -> None:
    # a watermark no disk meets: every persistent put is refused
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm", space=SpacePolicy(min_free_bytes=2**62))
    try:
        qm.run_mqsc("DEFINE QLOCAL(APP.Q) DEFPSIST(YES)", stop_on_error=True)
        conn = await qm.connect()
        assert conn.space_low
        with pytest.raises(MQError) as refused:
            await conn.put1("APP.Q", MQMD(persistence=1), b"x", PutOptions(syncpoint=True))
        assert refused.value.reason == Reason.Q_SPACE_NOT_AVAILABLE
        # space is back (the writer thread measured it) before the caller looked: the
        # refusal it holds was still the disk's
        qm.space.policy = SpacePolicy()
        qm.space.measure()
        assert not qm.space.low
        assert conn.space_low
        await conn.backout()
        assert not conn.space_low
        await conn.put1("APP.Q", MQMD(persistence=1), b"x", PutOptions(syncpoint=True))
        await conn.commit()
        assert qm.queue_depth("APP.Q") == 1
        await conn.disconnect()
    finally:
        await qm.close()
