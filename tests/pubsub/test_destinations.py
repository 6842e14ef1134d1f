"""Destinations named from outside (issue 29): resolved as MQ resolves them, then
checked against the gateway's own queues -- the pure rule, with the embedded queue
manager's real name resolution, and the engine using it for subscriber queues and
command responses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mq.embedded.name_resolution import ResolutionError, resolve_queue
from gateway.mq.embedded.objects import ObjectCatalogue, QMgrAttrs, QType, QueueDef, Usage
from gateway.pubsub.authorisation import Authoriser, Policy, Principal, PrincipalKind, Refusal
from gateway.pubsub.destinations import (
    KEPT_QUEUE,
    SYSTEM_QUEUE,
    TRANSMISSION_QUEUE,
    OwnQueues,
    QueueUse,
    ResolvedQueue,
)
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage, Outcome
from gateway.pubsub.store import MemoryStore
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, decode, rfh_message, rfh_publication

STOCK = "STOCK.STREAM"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
INTER = "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS"
APP = Principal.user("app1")


def catalogue() -> ObjectCatalogue:
    """QM1 with a stream queue, a DLQ, a transmission queue to QM2, and the aliases an
    operator might define for good reasons -- which outsiders then name."""
    cat = ObjectCatalogue(QMgrAttrs("QM1"))
    for q in (
        QueueDef(STOCK, QType.LOCAL),
        QueueDef(DLQ, QType.LOCAL),
        QueueDef("APP.SUB", QType.LOCAL),
        QueueDef("QM2", QType.LOCAL, usage=Usage.TRANSMISSION),
        QueueDef("APP.LOOP", QType.ALIAS, target=STOCK),  # an alias of a stream queue
        QueueDef("APP.DLQ", QType.ALIAS, target=DLQ),  # an alias of the DLQ
        QueueDef("APP.XMIT", QType.ALIAS, target="QM2"),  # an alias of a transmission queue
        QueueDef("APP.OK", QType.ALIAS, target="APP.SUB"),
        QueueDef("SELF", QType.REMOTE, remote_q_mgr_name="QM1"),  # QM alias of QM1
        QueueDef("SELF2", QType.REMOTE, remote_q_mgr_name="SELF"),  # a chain of them
        QueueDef("TO.QM2", QType.REMOTE, remote_name="ANY.Q", remote_q_mgr_name="QM2"),
    ):
        cat.queues[q.name] = q
    return cat


def own_queues(cat: ObjectCatalogue) -> OwnQueues:
    def resolve(q_mgr: str, queue: str) -> ResolvedQueue | None:
        try:
            r = resolve_queue(cat, queue, q_mgr)
        except ResolutionError:
            return None
        return ResolvedQueue(r.q_mgr_name, r.q_name, r.path)

    def is_xmitq(queue: str) -> bool:
        d = cat.get(queue)
        return d is not None and d.is_xmitq

    return OwnQueues("QM1", {STOCK}, is_transmission_queue=is_xmitq, resolve=resolve)


@pytest.mark.parametrize(
    ("q_mgr", "queue", "kind"),
    [
        ("", "APP.LOOP", KEPT_QUEUE),
        ("QM1", "APP.LOOP", KEPT_QUEUE),
        ("SELF", STOCK, KEPT_QUEUE),
        ("SELF2", STOCK, KEPT_QUEUE),
        ("SELF", "APP.LOOP", KEPT_QUEUE),
        ("", "APP.DLQ", SYSTEM_QUEUE),
        ("SELF", DLQ, SYSTEM_QUEUE),
        ("", "APP.XMIT", TRANSMISSION_QUEUE),
        ("SELF", "QM2", TRANSMISSION_QUEUE),
        ("", STOCK, KEPT_QUEUE),
        ("", "SYSTEM.MQGW.SINK.kafka1", SYSTEM_QUEUE),
    ],
)
def test_aliases_of_the_gateways_own_queues_are_its_own(q_mgr: str, queue: str, kind: str) -> None:
    own = own_queues(catalogue()).why_own(q_mgr, queue, QueueUse.SUBSCRIBER)
    assert own is not None and own.kind == kind
    assert queue in own.detail


@pytest.mark.parametrize(
    ("q_mgr", "queue"),
    [("", "APP.SUB"), ("", "APP.OK"), ("SELF", "APP.SUB"), ("QM2", STOCK), ("", "TO.QM2"),
     ("", "NOT.DEFINED")],
)
def test_other_queues_are_not(q_mgr: str, queue: str) -> None:
    assert own_queues(catalogue()).why_own(q_mgr, queue, QueueUse.SUBSCRIBER) is None


def test_the_refusal_names_the_path_followed() -> None:
    own = own_queues(catalogue()).why_own("SELF2", "APP.LOOP", QueueUse.REPLY)
    assert own is not None
    assert own.detail.startswith("APP.LOOP at SELF2 resolves to STOCK.STREAM (")
    assert "qmalias SELF2->SELF" in own.detail and "qmalias SELF->QM1" in own.detail


def test_system_queues_elsewhere_depend_on_the_use() -> None:
    own = own_queues(catalogue())
    # another broker's inter-broker queue: its proxy subscriptions' queue
    assert own.why_own("QM2", INTER, QueueUse.SUBSCRIBER) is None
    assert own.why_own("QM2", "SYSTEM.ADMIN.COMMAND.QUEUE", QueueUse.SUBSCRIBER) is not None
    # a reply the gateway puts for a requester: never a SYSTEM. queue anywhere
    assert own.why_own("QM2", INTER, QueueUse.REPLY) is not None
    # nor a requester route's destination (a command queue would take PCF commands)
    assert own.why_own("QM2", "SYSTEM.ADMIN.COMMAND.QUEUE", QueueUse.DESTINATION) is not None
    # a broker's response to another broker: only this queue manager's are refused
    assert own.why_own("QM2", INTER, QueueUse.RESPONSE) is None
    assert own.why_own("", INTER, QueueUse.RESPONSE) is not None


def test_resolved_names_from_mqopen_are_used_when_given() -> None:
    own = OwnQueues("QM1", {STOCK})  # no definitions known: by name alone
    assert own.why_own("", "APP.ALIAS", QueueUse.REPLY) is None
    found = own.why_own("", "APP.ALIAS", QueueUse.REPLY, ResolvedQueue("QM1", STOCK))
    assert found is not None and found.kind == KEPT_QUEUE


# A random catalogue of aliases, queue-manager aliases and local queues: the rule says
# "own" exactly when MQ's resolution lands on one of the gateway's own local queues.
_NAMES = ["A", "B", "C", "D"]


@st.composite
def catalogues(draw: st.DrawFn) -> ObjectCatalogue:
    cat = ObjectCatalogue(QMgrAttrs("QM1"))
    for local in ("STOCK.STREAM", "APP.Q", "QM9"):
        cat.queues[local] = QueueDef(
            local, QType.LOCAL, usage=Usage.TRANSMISSION if local == "QM9" else Usage.NORMAL
        )
    targets = [*_NAMES, "STOCK.STREAM", "APP.Q", "QM9", DLQ, "MISSING"]
    for name in _NAMES:
        kind = draw(st.sampled_from(["alias", "qmalias", "none"]))
        if kind == "alias":
            cat.queues[name] = QueueDef(name, QType.ALIAS, target=draw(st.sampled_from(targets)))
        elif kind == "qmalias":
            cat.queues[name] = QueueDef(
                name, QType.REMOTE, remote_q_mgr_name=draw(st.sampled_from(["QM1", *_NAMES]))
            )
    return cat


@given(catalogues(), st.sampled_from(["", "QM1", *_NAMES]),
       st.sampled_from([*_NAMES, "STOCK.STREAM", "APP.Q", "QM9", DLQ]))
def test_own_exactly_when_mq_resolves_to_an_own_local_queue(
    cat: ObjectCatalogue, q_mgr: str, queue: str
) -> None:
    own = own_queues(cat).why_own(q_mgr, queue, QueueUse.RESPONSE)
    try:
        r = resolve_queue(cat, queue, q_mgr)
    except ResolutionError:
        r = None
    named_local = q_mgr in ("", "QM1")
    lands_own = r is not None and r.is_local and r.q_name in {STOCK, DLQ, "QM9"}
    named_own = named_local and queue in {STOCK, DLQ, "QM9"}
    assert (own is not None) == (lands_own or named_own)


# ------------------------------------------------------------------ in the engine ----


def engine(cat: ObjectCatalogue, *, authorise: bool) -> PubSubEngine:
    own = own_queues(cat)
    authoriser = Authoriser(Policy(), "QM1", own_queues=own) if authorise else None
    return PubSubEngine("QM1", MemoryStore(), broker_queues=[STOCK], authoriser=authoriser,
                        own_queues=own)


def reason_of(out: Outcome) -> str:
    """MQPSReason of the engine's MQRFH response."""
    assert out.response is not None
    return dict(decode(out.response.md, out.response.body).pairs)["MQPSReason"]


def regsub(queue: str, q_mgr: str = "", user: str = "app1") -> InboundMessage:
    return rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "*"),
         ("MQPSQName", queue), ("MQPSQMgrName", q_mgr)],
        reply_to_q="APP.SUB", msg_type=MsgType.REQUEST, user_identifier=user,
    )


@pytest.mark.parametrize(("q_mgr", "queue"), [("", "APP.LOOP"), ("SELF", STOCK),
                                              ("", "APP.DLQ"), ("SELF2", "APP.LOOP")])
def test_a_subscriber_queue_through_an_alias_is_refused(q_mgr: str, queue: str) -> None:
    # Without authorisation the engine's own check answers MQRCCF_Q_NAME_ERROR; with it,
    # the application is refused as not authorised (the command dead-lettered).
    for authorise, reason in ((False, Reason.Q_NAME_ERROR), (True, Reason.CF_NOT_AUTHORIZED)):
        e = engine(catalogue(), authorise=authorise)
        out = e.handle(regsub(queue, q_mgr))
        e.commit()
        assert reason_of(out) == str(int(reason))
        assert not e.store.load().subscriptions
        # nothing a publication can loop through
        pub = e.handle(rfh_publication(STOCK, "Stock/IBM", b"1"))
        assert pub.deliveries == []


def test_the_gateway_itself_is_refused_its_own_queues_too() -> None:
    # A command put under the gateway's own user (trusted) or naming a trusted neighbour
    # still never makes a stream queue a subscriber queue, through an alias or not.
    own = own_queues(catalogue())
    authoriser = Authoriser(Policy(), "QM1", gateway_users=["mqgw"], own_queues=own)
    e = PubSubEngine("QM1", MemoryStore(), authoriser=authoriser, own_queues=own)
    out = e.handle(regsub("APP.LOOP", user="mqgw"))
    assert reason_of(out) == str(int(Reason.Q_NAME_ERROR))


def test_no_response_goes_to_the_gateways_own_queue() -> None:
    own = own_queues(catalogue())
    authoriser = Authoriser(Policy(), "QM1", own_queues=own)
    e = PubSubEngine("QM1", MemoryStore(), authoriser=authoriser, own_queues=own)
    msg = rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "*"),
         ("MQPSQName", "APP.SUB")],
        reply_to_q="APP.LOOP", msg_type=MsgType.REQUEST, user_identifier="app1",
    )
    out = e.handle(msg)
    assert out.response is None  # would have been a command on STOCK.STREAM
    assert e.responses_refused == 1
    assert authoriser.refusals == {("mq", Refusal.BROKER_QUEUE.value): 1}


def test_subscriptions_whose_queue_becomes_an_alias_are_dropped() -> None:
    cat = catalogue()
    e = engine(cat, authorise=True)
    out = e.handle(regsub("APP.LATER"))
    e.commit()
    assert reason_of(out) == "0"
    assert e.drop_subscriptions_to_own_queues() == 0
    cat.queues["APP.LATER"] = QueueDef("APP.LATER", QType.ALIAS, target=STOCK)
    assert e.drop_subscriptions_to_own_queues() == 1
    assert not e.store.load().subscriptions
    assert e.handle(rfh_publication(STOCK, "Stock/IBM", b"1")).deliveries == []


def test_the_authoriser_checks_reply_queues_for_everyone() -> None:
    own = own_queues(catalogue())
    a = Authoriser(Policy(enabled=False), "QM1", gateway_users=["mqgw"], own_queues=own)
    gateway = Principal(PrincipalKind.BROKER, "mqgw")
    decision = a.may_use_queue(gateway, "SELF", "APP.LOOP", QueueUse.REPLY)
    assert not decision and decision.reason is Refusal.BROKER_QUEUE
    assert "reply-to queue" in decision.detail
    # lists apply to untrusted requesters
    listed = Authoriser(Policy(reply_queue_allow=("REPLY.*",)), "QM1", own_queues=own)
    assert listed.may_use_queue(APP, "", "REPLY.ONE", QueueUse.REPLY)
    refused = listed.may_use_queue(APP, "", "APP.SUB", QueueUse.REPLY)
    assert refused.reason is Refusal.QUEUE_NOT_LISTED
    assert "authorisation.reply_queues.allow" in refused.detail


def test_reply_topics_of_the_gateways_own_are_refused() -> None:
    a = Authoriser(Policy(), "QM1")
    who = Principal(PrincipalKind.PLUGIN, "mqtt1")
    refused = a.may_use_topic(who, "mq/STOCK/IBM", "it is an outbound stream topic")
    assert refused.reason is Refusal.OWN_TOPIC and "mq/STOCK/IBM" in refused.detail
    assert a.may_use_topic(who, "app/replies/1", "")
    assert a.may_use_topic(who, "app/replies/1", "", ["app/replies/*"])
    assert a.may_use_topic(who, "other/1", "", ["app/replies/*"]).reason is (
        Refusal.TOPIC_NOT_LISTED
    )


@pytest.mark.parametrize(
    ("queue", "q_mgr", "reason"),
    [
        # a name longer than MQ's 48 would be cut to STOCK.STREAM where it is opened
        ("STOCK.STREAM" + " " * 36 + "X", "", Reason.Q_NAME_ERROR),
        ("APP" + "Q" * 60, "", Reason.Q_NAME_ERROR),
        ("APP SUB", "", Reason.Q_NAME_ERROR),
        ("APP.SUB", "QM 2", Reason.CF_Q_MGR_NAME_ERROR),
        ("APP.SUB", "Q" * 49, Reason.CF_Q_MGR_NAME_ERROR),
    ],
)
def test_a_subscriber_queue_that_is_no_mq_name_is_refused(
    queue: str, q_mgr: str, reason: int
) -> None:
    e = engine(catalogue(), authorise=True)
    out = e.handle(regsub(queue, q_mgr))
    e.commit()
    assert reason_of(out) == str(int(reason))
    assert out.dead_letter is not None  # malformed: the command is set aside, with it
    assert not e.store.load().subscriptions


def test_trailing_blanks_are_mq_padding() -> None:
    e = engine(catalogue(), authorise=True)
    assert reason_of(e.handle(regsub("APP.SUB" + " " * 41))) == "0"
    e.commit()
    (sub,) = e.store.load().subscriptions
    assert sub.destination.queue == "APP.SUB"


def test_the_dead_letter_queue_is_asked_as_it_is_now() -> None:
    deadq = {"name": DLQ}
    own = OwnQueues("QM1", is_kept=lambda q: q == deadq["name"])
    assert own.why_own("", "APP.DLQ2", QueueUse.SUBSCRIBER) is None
    deadq["name"] = "APP.DLQ2"  # ALTER QMGR DEADQ(APP.DLQ2)
    found = own.why_own("", "APP.DLQ2", QueueUse.SUBSCRIBER)
    assert found is not None and found.kind == KEPT_QUEUE
