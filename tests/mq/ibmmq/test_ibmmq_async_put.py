"""The ibmmq adapter and asynchronous put: MQPMO_ASYNC_RESPONSE passed through to the MQI
module, MQSTAT (``QueueManager.stat``) read back as AsyncPutStatus, and a commit after a
failed asynchronous syncpoint put backed out and failed (2003), as on the embedded queue
manager. Driven through the stand-in MQI module (tests/support/mqi_standin.py), whose
``stat`` is given here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.ibmmq.mqi import MQPMO_ASYNC_RESPONSE, MQSTAT_TYPE_ASYNC_ERROR, put_options
from gateway.mq.port import (
    PMO_ASYNC_RESPONSE,
    AsyncPutStatus,
    MQError,
    OpenOption,
    PutOptions,
    async_put_status,
)
from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.mqi_standin import StandIn


@dataclass
class STS:
    """The fields of pymqi's STS (MQSTS) the adapter reads."""

    CompCode: int = 0
    Reason: int = 0
    PutSuccessCount: int = 0
    PutWarningCount: int = 0
    PutFailureCount: int = 0
    ObjectName: bytes = b" " * 48
    ObjectQMgrName: bytes = b" " * 48
    ResolvedObjectName: bytes = b" " * 48
    ResolvedQMgrName: bytes = b" " * 48


def with_stat(standin: StandIn, answers: list[STS]) -> list[int]:
    """Give the stand-in's QueueManager an MQSTAT answering ``answers`` in turn; the
    status types asked for are returned."""
    asked: list[int] = []

    def stat(self: Any, status_type: int) -> STS:
        standin.record("stat", type=status_type)
        asked.append(status_type)
        return answers.pop(0) if answers else STS()

    standin.module.QueueManager.stat = stat
    return asked


def test_the_option_is_ibms_value_and_reaches_the_pmo(standin: StandIn) -> None:
    assert PMO_ASYNC_RESPONSE == MQPMO_ASYNC_RESPONSE == 0x10000 and MQSTAT_TYPE_ASYNC_ERROR == 0
    mqi = standin.module
    assert put_options(mqi, PutOptions(async_response=True)).Options & 0x10000
    assert not put_options(mqi, PutOptions()).Options & 0x10000


async def test_put_and_put1_pass_async_response_through(standin: StandIn) -> None:
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(MQMD(), b"a", PutOptions(syncpoint=True, async_response=True))
        await conn.put1("APP.Q", MQMD(), b"b", PutOptions(async_response=True))
        await q.put(MQMD(), b"c", PutOptions(syncpoint=True))
        await conn.backout()
    finally:
        await conn.disconnect()
    puts = [c for c in standin.calls if c.name == "put"]
    assert [bool(c.args["options"] & 0x10000) for c in puts] == [True, False]
    assert puts[0].args["options"] & 0x2  # syncpoint kept alongside
    put1s = [c for c in standin.calls if c.name == "put1"]
    assert len(put1s) == 1 and put1s[0].args["options"] & 0x10000
    assert not put1s[0].args["options"] & 0x2  # no syncpoint asked, none added


async def test_async_status_maps_mqsts_and_resets(standin: StandIn) -> None:
    asked = with_stat(standin, [STS(CompCode=2, Reason=2053, PutSuccessCount=7,
                                    PutFailureCount=2, ObjectName=b"APP.Q".ljust(48),
                                    ResolvedQMgrName=b"STANDIN".ljust(48))])
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    try:
        status = await async_put_status(conn)
        again = await async_put_status(conn)
    finally:
        await conn.disconnect()
    assert asked == [0, 0]
    assert status == AsyncPutStatus(comp_code=2, reason=2053, put_success_count=7,
                                    put_failure_count=2, object_name="APP.Q",
                                    resolved_q_mgr_name="STANDIN")
    assert again == AsyncPutStatus()


async def test_a_commit_after_a_failed_async_put_backs_out_and_fails(standin: StandIn) -> None:
    with_stat(standin, [STS(CompCode=2, Reason=2053, PutSuccessCount=1, PutFailureCount=1,
                            ObjectName=b"APP.Q".ljust(48))])
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(MQMD(), b"lost", PutOptions(syncpoint=True, async_response=True))
        with pytest.raises(MQError) as info:
            await conn.commit()
        assert info.value.reason == Reason.BACKED_OUT
        assert info.value.comp_code == CompCode.WARNING
        assert "2053" in str(info.value) and "APP.Q" in str(info.value)
        names = [c.name for c in standin.calls]
        assert names[-2:] == ["stat", "backout"] and "commit" not in names
        assert standin.qm.queue_depth("APP.Q") == 0
        # the status MQSTAT gave the commit is the caller's next status
        status = await async_put_status(conn)
        assert (status.reason, status.put_failure_count) == (2053, 1)
        # a unit of synchronous puts commits without asking MQSTAT
        calls = len(standin.calls)
        await q.put(MQMD(), b"kept", PutOptions(syncpoint=True))
        await conn.commit()
        assert [c.name for c in standin.calls[calls:]] == ["put", "commit"]
    finally:
        await conn.disconnect()
    assert standin.qm.queue_depth("APP.Q") == 1


async def test_a_failure_seen_by_the_callers_mqstat_inside_the_unit_still_backs_it_out(
        standin: StandIn) -> None:
    """F1: MQSTAT resets its record, so the failure the application's own MQSTAT read
    inside the unit is kept by the adapter: the commit backs out and fails (2003)."""
    asked = with_stat(standin, [STS(CompCode=2, Reason=2053, PutSuccessCount=1,
                                    PutFailureCount=1, ObjectName=b"APP.Q".ljust(48))])
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(MQMD(), b"ok-1", PutOptions(syncpoint=True, async_response=True))
        status = await async_put_status(conn)
        assert (status.reason, status.put_failure_count) == (2053, 1)
        with pytest.raises(MQError) as info:
            await conn.commit()
        assert info.value.reason == Reason.BACKED_OUT and "2053" in str(info.value)
        names = [c.name for c in standin.calls]
        assert "commit" not in names and names[-1] == "backout"
        assert asked == [0]  # the commit did not need a second MQSTAT
        # the unit is decided: the next one commits normally
        await q.put(MQMD(), b"kept", PutOptions(syncpoint=True, async_response=True))
        await conn.commit()
    finally:
        await conn.disconnect()
    assert standin.qm.queue_depth("APP.Q") == 1


async def test_a_commit_whose_backout_fails_stays_doomed(standin: StandIn) -> None:
    """F7: the marker is cleared only after the backout succeeded: a retried commit
    after a failed backout backs out again, never commits."""
    with_stat(standin, [STS(CompCode=2, Reason=2053, PutFailureCount=1,
                            ObjectName=b"APP.Q".ljust(48))])
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    real_backout = standin.module.QueueManager.backout
    failures = [1]

    def backout(self: Any) -> None:
        if failures:
            failures.pop()
            raise standin.module.MQMIError(2, 2195)  # MQRC_UNEXPECTED_ERROR
        real_backout(self)

    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(MQMD(), b"a", PutOptions(syncpoint=True, async_response=True))
        standin.module.QueueManager.backout = backout
        with pytest.raises(MQError) as first:
            await conn.commit()
        assert first.value.reason == 2195
        with pytest.raises(MQError) as again:
            await conn.commit()
        assert again.value.reason == Reason.BACKED_OUT
        assert "commit" not in [c.name for c in standin.calls]
    finally:
        standin.module.QueueManager.backout = real_backout
        await conn.disconnect()
    assert standin.qm.queue_depth("APP.Q") == 0


async def test_a_failed_async_put_outside_the_unit_does_not_back_it_out(
        standin: StandIn) -> None:
    """F8: MQSTAT counts every asynchronous put of the hconn; one made outside any unit
    before the unit is taken out of the record (an MQSTAT before the unit's first
    asynchronous syncpoint put), so the unit's commit sees only its own puts."""
    asked = with_stat(standin, [STS(CompCode=2, Reason=2053, PutFailureCount=1,
                                    ObjectName=b"OTHER.Q".ljust(48)), STS(PutSuccessCount=1)])
    conn = await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN"), mqi=standin.module).connect()
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await conn.put1("APP.Q", MQMD(), b"outside", PutOptions(async_response=True))
        await q.put(MQMD(), b"in-unit", PutOptions(syncpoint=True, async_response=True))
        await conn.commit()
        assert asked == [0, 0]
        # the failure outside the unit is still the caller's next status
        status = await async_put_status(conn)
        assert (status.reason, status.object_name, status.put_failure_count) == (
            2053, "OTHER.Q", 1)
    finally:
        await conn.disconnect()
    assert standin.qm.queue_depth("APP.Q") == 2
