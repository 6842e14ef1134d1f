"""A RegSub/DeregSub whose subscriber queue is a registered sink's backlog queue makes
or removes that sink's subscription (what ``mqgw streams move`` sends) only when sealed
with the gateway's backlog key and recent, for a ``sinks: owner`` stream, never as a
DeregAll; whoever sent it (the gateway's user identifier included) counts for nothing:
any other is answered not authorised (3081) and dead-lettered with MQRC_NOT_AUTHORIZED
(docs/security.md, "Sink subscriptions")."""

from __future__ import annotations

import dataclasses
import os

from gateway.pubsub.authorisation import Authoriser, Policy
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import Neighbour, NeighbourKind, NeighbourRole
from gateway.pubsub.options import RegOpt
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import SubFormat
from gateway.pubsub.store import MemoryStore
from gateway.runtime.sink_command_seal import MAX_AGE_S, SinkCommandCheck, seal_command
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, decode, rfh2_message, rfh_message

S = "PRICES"
BACKLOG = "SYSTEM.MQGW.SINK.mem"
GATEWAY_USER = "mqgw"
KEY = bytes(range(32))
NOW = 1_800_000_000.0


def engine(**kw: object) -> PubSubEngine:
    e = PubSubEngine(
        "QM1", MemoryStore(), broker_queues=[S],
        authoriser=Authoriser(Policy(), "QM1", broker_queues=[S],
                              gateway_users=[GATEWAY_USER]),
        **kw,  # type: ignore[arg-type]
    )
    e.sink_queues[BACKLOG] = "mem"
    e.sink_command_check = SinkCommandCheck(KEY, clock=lambda: NOW)
    e.sink_owner_streams = frozenset({S})
    return e


def sink_command(command: str, user: str = "anyone", *, new_only: bool = True,
                 q_mgr: str = "QM1", reply_to_q_mgr: str = "QM1",
                 reply_to_q: str = "REPLY.Q", key: bytes | None = KEY, put_at: float = NOW,
                 stream: str = S, reg_opt: str = "") -> InboundMessage:
    """The command, sealed with ``key`` put at ``put_at`` (None: not sealed)."""
    psc = [("Command", command)]
    if command == "RegSub" and new_only:
        psc.append(("RegOpt", "NewPubsOnly"))
    if reg_opt:
        psc.append(("RegOpt", reg_opt))
    psc += [("Topic", f"$SYS/STREAM/{stream}/#"), ("QMgrName", q_mgr), ("QName", BACKLOG)]
    msg = rfh2_message(CONTROL, psc, reply_to_q=reply_to_q, reply_to_q_mgr=reply_to_q_mgr,
                       msg_type=MsgType.REQUEST, user_identifier=user, msg_id=os.urandom(24))
    if key is not None:
        md = dataclasses.replace(msg.md)
        seal_command(key, md, msg.body, put_at)
        msg = dataclasses.replace(msg, md=md)
    return msg


def retain(e: PubSubEngine, topic: str) -> None:
    out = e.handle(rfh_message(S, [("MQPSCommand", "Publish"), ("MQPSStreamName", S),
                                   ("MQPSTopic", topic), ("MQPSPubOpts", "RetainPub")],
                               b"v1", reply_to_q="PUB.Q"))
    assert out.reason == 0, out
    e.commit()


def sink_subs(e: PubSubEngine) -> list[tuple[str, str, str, int]]:
    return [(s.destination.sink, s.stream, s.topic, s.reg_opts) for s in e.subscriptions
            if s.destination.is_sink]


def assert_refused(e: PubSubEngine, msg: InboundMessage, why: str) -> None:
    out = e.handle(msg)
    assert out.dead_letter is not None and out.dead_letter.reason == Reason.NOT_AUTHORIZED
    assert out.mutations == [] and out.deliveries == []
    assert out.response is not None
    assert decode(out.response.md, out.response.body).get("pscr/Response/Reason") == "3081"
    assert "sink 'mem'" in out.dead_letter.detail and why in out.dead_letter.detail, \
        out.dead_letter.detail


def test_a_sealed_command_makes_and_removes_a_sinks_subscription_by_its_backlog_queue() -> None:
    e = engine()
    retain(e, "T/1")
    out = e.handle(sink_command("RegSub"))
    assert out.reason == 0 and out.dead_letter is None, out
    assert out.deliveries == []  # NewPubsOnly: the sink's target has the retained ones
    e.commit()
    assert sink_subs(e) == [("mem", S, "#", int(RegOpt.NEW_PUBLICATIONS_ONLY))]
    (sub,) = [s for s in e.subscriptions if s.destination.is_sink]
    assert sub.fmt is SubFormat.SINK and sub.destination.queue == ""
    assert out.response is not None
    assert decode(out.response.md, out.response.body).get("pscr/Completion") == "ok"
    # again: the same subscription (a move run again after a crash)
    again = e.handle(sink_command("RegSub"))
    assert again.reason == 0 and again.dead_letter is None
    e.commit()
    assert len(sink_subs(e)) == 1
    # a publication now reaches the sink
    pub = e.handle(rfh_message(S, [("MQPSCommand", "Publish"), ("MQPSStreamName", S),
                                   ("MQPSTopic", "T/2")], b"new", reply_to_q="PUB.Q"))
    assert [d.destination.sink for d in pub.deliveries] == ["mem"]
    e.commit()
    gone = e.handle(sink_command("DeregSub"))
    assert gone.reason == 0 and gone.dead_letter is None
    e.commit()
    assert sink_subs(e) == []
    # a DeregSub of a subscription that is gone is answered NOT_REGISTERED (the move
    # counts it as done), and nothing is dead-lettered
    twice = e.handle(sink_command("DeregSub"))
    assert twice.reason == Reason.NOT_REGISTERED and twice.dead_letter is None


def test_without_new_pubs_only_the_sink_gets_the_retained_publications() -> None:
    e = engine()
    retain(e, "T/1")
    out = e.handle(sink_command("RegSub", new_only=False))
    assert out.reason == 0
    assert [(d.destination.sink, d.topic) for d in out.deliveries] == [
        ("mem", f"$SYS/STREAM/{S}/T/1")]


def test_an_unsealed_command_is_refused_whoever_it_names_as_its_sender() -> None:
    e = engine()
    e.handle(sink_command("RegSub"))
    e.commit()
    for command in ("RegSub", "DeregSub"):
        # the gateway's own user identifier, as a channel may deliver it
        assert_refused(e, sink_command(command, GATEWAY_USER, key=None), "not sealed")
        assert_refused(e, sink_command(command, GATEWAY_USER, key=bytes(32)), "not sealed")
    assert e.authoriser is not None
    assert e.authoriser.refusals == {("mq", "sink_subscription"): 4}
    assert sink_subs(e) == [("mem", S, "#", int(RegOpt.NEW_PUBLICATIONS_ONLY))]  # kept


def test_a_stale_seal_is_refused() -> None:
    e = engine()
    assert_refused(e, sink_command("RegSub", put_at=NOW - MAX_AGE_S - 1), "stale")
    assert_refused(e, sink_command("RegSub", put_at=NOW + MAX_AGE_S + 1), "stale")
    assert sink_subs(e) == []
    assert e.handle(sink_command("RegSub", put_at=NOW - MAX_AGE_S + 1)).dead_letter is None


def test_a_sealed_deregall_is_refused() -> None:
    e = engine()
    e.handle(sink_command("RegSub"))
    e.commit()
    assert_refused(e, sink_command("DeregSub", reg_opt="DeregAll"), "DeregAll")
    assert len(sink_subs(e)) == 1


def test_a_stream_not_sinks_owner_here_is_refused() -> None:
    e = engine()
    e.sink_owner_streams = frozenset()
    assert_refused(e, sink_command("RegSub"), "not configured `sinks: owner`")
    assert sink_subs(e) == []


def test_a_neighbour_may_not_change_a_sinks_subscriptions_unsealed() -> None:
    e = engine()
    e.set_neighbours({"QM2": Neighbour("QM2", NeighbourKind.GATEWAY, NeighbourRole.CHILD,
                                       frozenset({S}))})
    assert_refused(e, sink_command("RegSub", "mqm", reply_to_q_mgr="QM2", key=None,
                                   reply_to_q="SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS"),
                   "not sealed")
    assert sink_subs(e) == []


def test_without_a_check_nobody_changes_a_sinks_subscriptions() -> None:
    e = PubSubEngine("QM1", MemoryStore(), broker_queues=[S])  # IBM MQ: no key here
    e.sink_queues[BACKLOG] = "mem"
    e.sink_owner_streams = frozenset({S})
    assert_refused(e, sink_command("RegSub"), "no backlog key")
    assert sink_subs(e) == []


def test_a_backlog_queue_of_no_registered_sink_stays_a_refused_subscriber_queue() -> None:
    e = engine()
    e.sink_queues.clear()
    out = e.handle(sink_command("RegSub", GATEWAY_USER))
    assert out.reason == Reason.Q_NAME_ERROR  # a SYSTEM. queue, as before
    assert sink_subs(e) == []
