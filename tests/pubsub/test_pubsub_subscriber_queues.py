"""The pure engine's rules for subscriber queues: the broker's own are refused (reason
MQRCCF_Q_NAME_ERROR), failing ones are suspended and resumed by a new RegSub."""

from __future__ import annotations

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, DEFAULT, decode, rfh_message


def engine(**kw: object) -> PubSubEngine:
    return PubSubEngine("QM1", MemoryStore(), broker_queues=["STOCK.STREAM"], **kw)  # type: ignore[arg-type]


def regsub(e: PubSubEngine, queue: str, q_mgr: str = "QM1") -> dict[str, str]:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", "t"), ("MQPSQName", queue)]
    pairs.append(("MQPSQMgrName", q_mgr))
    out = e.handle(rfh_message(CONTROL, pairs, reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST))
    e.commit()
    assert out.response is not None and out.dead_letter is None
    return dict(decode(out.response.md, out.response.body).pairs)


def test_mqrfh_regsub_of_a_broker_queue_is_refused_with_q_name_error() -> None:
    e = engine()
    for queue in ("STOCK.STREAM", "SYSTEM.BROKER.CONTROL.QUEUE", "SYSTEM.ANYTHING"):
        answer = regsub(e, queue)
        assert answer["MQPSReason"] == str(int(Reason.Q_NAME_ERROR))
        assert answer["MQPSParmId"] == "MQPSQName"
    assert e.subscriptions == []


def test_the_same_queue_name_on_another_queue_manager_is_allowed() -> None:
    e = engine()
    assert regsub(e, "STOCK.STREAM", "QM2")["MQPSReason"] == "0"
    assert len(e.subscriptions) == 1


def test_suspension_after_n_failures_in_a_row_and_resume_by_regsub() -> None:
    e = engine(suspend_after=2)
    regsub(e, "SUB.Q")
    publish = rfh_message(DEFAULT, [("MQPSCommand", "Publish"), ("MQPSTopic", "t")], b"x")
    e.delivery_failed("QM1", "SUB.Q", 2085)
    e.delivered("QM1", "SUB.Q")  # a success ends the run
    e.delivery_failed("QM1", "SUB.Q", 2085)
    assert e.suspended_subscriptions == 0
    e.delivery_failed("", "SUB.Q", 2085)  # blank queue manager = this one
    e.commit()
    assert e.suspended_subscriptions == 1
    assert e.handle(publish).deliveries == []
    regsub(e, "SUB.Q")
    assert e.suspended_subscriptions == 0
    assert len(e.handle(publish).deliveries) == 1


def test_a_suspension_backed_out_with_its_unit_of_work_is_undone() -> None:
    e = engine(suspend_after=1)
    regsub(e, "SUB.Q")
    e.delivery_failed("QM1", "SUB.Q", 2085)
    assert e.suspended_subscriptions == 1
    e.rollback()
    assert e.suspended_subscriptions == 0
