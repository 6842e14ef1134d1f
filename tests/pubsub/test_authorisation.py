"""Stream and topic authorisation (issue 15): the pure policy, then the engine refusing
MQ commands with MQRCCF_NOT_AUTHORIZED in the response and the MQDLH."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.pubsub.authorisation import (
    Action,
    Authoriser,
    Policy,
    Principal,
    PrincipalKind,
    Refusal,
    Rule,
    topic_pattern_covers,
)
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.neighbours import Neighbour, NeighbourKind, NeighbourRole
from gateway.pubsub.outcome import Outcome
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.topics import Scheme, match_topic_pattern
from gateway.runtime.authorisation_config import AuthorisationConfig
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, DEFAULT, decode, rfh2_message, rfh_message

ADMIN = "SYSTEM.BROKER.ADMIN.STREAM"
STOCK = "STOCK.STREAM"
BOTH = frozenset({Action.PUBLISH, Action.SUBSCRIBE})
APP = Principal.user("app1    ")
NOT_AUTHORIZED = Reason.CF_NOT_AUTHORIZED


def authoriser(policy: Policy | None = None, **kw: object) -> Authoriser:
    return Authoriser(
        policy or Policy(),
        "QM1",
        broker_queues=[STOCK, "SYSTEM.DEAD.LETTER.QUEUE"],
        is_transmission_queue=lambda q: q == "QM2.XMITQ",
        **kw,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ the policy -------


def test_principal_is_the_trimmed_user_identifier() -> None:
    assert Principal(PrincipalKind.USER, "app1") == APP
    assert str(APP) == "user 'app1'"


def test_default_policy_protects_system_streams_but_not_the_default_stream() -> None:
    a = authoriser()
    refused = a.may_publish(APP, ADMIN, "MQ/SA/Broker/x")
    assert not refused and refused.reason is Refusal.PROTECTED_STREAM
    assert "SYSTEM.BROKER.ADMIN.STREAM" in refused.detail and "user 'app1'" in refused.detail
    assert a.may_publish(APP, DEFAULT, "Sport/Soccer")
    assert a.may_publish(APP, STOCK, "IBM/Latest")
    assert a.may_subscribe(APP, ADMIN, "#")  # broker metadata may be read


def test_neighbours_are_trusted_and_plugins_bounded_by_protected_streams() -> None:
    a = authoriser()
    assert a.may_publish(Principal(PrincipalKind.NEIGHBOUR, "QM2"), ADMIN, "x")
    plugin = Principal(PrincipalKind.PLUGIN, "kafka-main")
    assert a.may_publish(plugin, ADMIN, "x").reason is Refusal.PROTECTED_STREAM
    distrust = authoriser(Policy(trust_neighbours=False))
    assert not distrust.may_publish(Principal(PrincipalKind.NEIGHBOUR, "QM2"), ADMIN, "x")


def test_disabled_policy_allows_everything() -> None:
    a = authoriser(Policy(enabled=False))
    assert a.may_publish(APP, ADMIN, "x")
    assert a.may_use_subscriber_queue(APP, "", "SYSTEM.ADMIN.COMMAND.QUEUE")


def test_first_matching_rule_decides_then_the_default() -> None:
    policy = Policy(
        rules=(
            Rule(frozenset({Action.PUBLISH}), (STOCK,), ("IBM/#",), ("app1",), allow=False),
            Rule(BOTH, (STOCK,), ("#",), ("app*",)),
        ),
        default_allow=False,
    )
    a = authoriser(policy)
    denied = a.may_publish(APP, STOCK, "IBM/Latest")
    assert denied.reason is Refusal.DENIED_BY_RULE and "rule 1" in denied.detail
    assert a.may_publish(APP, STOCK, "HPQ/Latest")
    assert a.may_publish(Principal.user("app2"), STOCK, "IBM/Latest")
    nobody = a.may_publish(Principal.user("batch"), STOCK, "IBM/Latest")
    assert nobody.reason is Refusal.NO_RULE


def test_plugin_rules_and_default() -> None:
    policy = Policy(
        plugin_rules={"k1": (Rule(frozenset({Action.PUBLISH}), (STOCK,), ("Orders/#",)),)},
        plugin_defaults={"k1": False},
    )
    a = authoriser(policy)
    k1, k2 = Principal(PrincipalKind.PLUGIN, "k1"), Principal(PrincipalKind.PLUGIN, "k2")
    assert a.may_publish(k1, STOCK, "Orders/1")
    assert a.may_publish(k1, STOCK, "Trades/1").reason is Refusal.NO_RULE
    assert a.may_publish(k1, DEFAULT, "Orders/1").reason is Refusal.NO_RULE
    assert a.may_publish(k2, STOCK, "Trades/1")  # an instance not listed


def test_subscription_patterns_must_stay_within_the_rule() -> None:
    policy = Policy(rules=(Rule(BOTH, (STOCK,), ("Stock/#",)),), default_allow=False)
    a = authoriser(policy)
    assert a.may_subscribe(APP, STOCK, "Stock/+/IBM")
    assert a.may_subscribe(APP, STOCK, "Stock/#")
    assert not a.may_subscribe(APP, STOCK, "#")
    assert not a.may_subscribe(APP, STOCK, "+/IBM")
    assert a.may_subscribe(APP, STOCK, "Stock/I*", Scheme.CHAR)
    assert not a.may_subscribe(APP, STOCK, "St*", Scheme.CHAR)
    assert a.may_subscribe(APP, STOCK, "Stock/100%%", Scheme.CHAR)


@pytest.mark.parametrize(
    ("q_mgr", "queue", "reason"),
    [
        ("", "SYSTEM.BROKER.CONTROL.QUEUE", Refusal.SYSTEM_QUEUE),
        ("QM1", "SYSTEM.ADMIN.COMMAND.QUEUE", Refusal.SYSTEM_QUEUE),
        ("QM9", "SYSTEM.ADMIN.COMMAND.QUEUE", Refusal.SYSTEM_QUEUE),
        ("", STOCK, Refusal.BROKER_QUEUE),
        ("QM1", "QM2.XMITQ", Refusal.TRANSMISSION_QUEUE),
    ],
)
def test_fixed_subscriber_queue_rules(q_mgr: str, queue: str, reason: Refusal) -> None:
    decision = authoriser().may_use_subscriber_queue(APP, q_mgr, queue)
    assert not decision and decision.reason is reason and queue in decision.detail


def test_subscriber_queue_allow_and_deny_lists() -> None:
    policy = Policy(queue_deny=("SECRET.*",), queue_allow=("APP.*", "QM2/*"))
    a = authoriser(policy)
    assert a.may_use_subscriber_queue(APP, "", "APP.SUB").allowed
    assert a.may_use_subscriber_queue(APP, "QM2", "ANY.Q").allowed
    assert a.may_use_subscriber_queue(APP, "", "SECRET.Q").reason is Refusal.QUEUE_DENIED
    assert a.may_use_subscriber_queue(APP, "", "OTHER.Q").reason is Refusal.QUEUE_NOT_LISTED
    # Another broker's proxy subscriptions name its inter-broker queue.
    inter = "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS"
    assert authoriser().may_use_subscriber_queue(APP, "QM7", inter).allowed
    assert not authoriser().may_use_subscriber_queue(APP, "", inter).allowed
    # Another queue manager's stream-queue name is no broker queue here.
    assert authoriser().may_use_subscriber_queue(APP, "QM2", STOCK).allowed
    assert (
        authoriser()
        .may_use_subscriber_queue(
            Principal(PrincipalKind.NEIGHBOUR, "QM2"),
            "QM2",
            "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS",
        )
        .allowed
    )


def test_the_gateways_own_user_is_trusted_and_marks_plugins() -> None:
    a = authoriser(gateway_users=["mqgw"])
    assert a.principal_of("mqgw", origin="k1") == Principal(PrincipalKind.PLUGIN, "k1")
    gateway = a.principal_of("mqgw  ")
    assert gateway == Principal(PrincipalKind.BROKER, "mqgw")
    assert a.may_publish(gateway, ADMIN, "MQ/QM1/StreamSupport")
    assert a.may_use_subscriber_queue(gateway, "", "SYSTEM.ANY")
    assert a.principal_of("app1", origin="k1") == Principal.user("app1")
    assert a.principal_of("app1", neighbour="QM2").kind is PrincipalKind.NEIGHBOUR


def test_refusals_are_counted_by_entrance_and_reason() -> None:
    a = authoriser()
    a.count("mq", a.may_publish(APP, ADMIN, "x"))
    a.count("mq", a.may_publish(APP, DEFAULT, "x"))  # allowed: not counted
    assert a.refusals == {("mq", "protected_stream"): 1}


_level = st.sampled_from(["a", "b", "c", "+", "#"])
_topic_level = st.sampled_from(["a", "b", "c"])


@given(
    rule=st.lists(_level, min_size=1, max_size=4).map("/".join),
    sub=st.lists(_level, min_size=1, max_size=4).map("/".join),
    topic=st.lists(_topic_level, min_size=1, max_size=5).map("/".join),
)
def test_covering_is_sound(rule: str, sub: str, topic: str) -> None:
    """Whenever a rule is said to cover a subscription, every topic the subscription
    matches is matched by the rule (never too permissive)."""
    if topic_pattern_covers(rule, sub) and match_topic_pattern(sub, topic):
        assert match_topic_pattern(rule, topic)


@given(
    prefix=st.lists(_topic_level, min_size=0, max_size=3).map("/".join),
    rest=st.text(alphabet="abc/*?", max_size=6),
    topic=st.lists(_topic_level, min_size=1, max_size=5).map("/".join),
)
def test_char_pattern_covering_is_sound(prefix: str, rest: str, topic: str) -> None:
    from gateway.pubsub.topics import compile_char_pattern

    rule = f"{prefix}/#" if prefix else "#"
    sub = f"{prefix}/{rest}" if prefix else rest
    if not sub:
        return
    if topic_pattern_covers(rule, sub, Scheme.CHAR) and compile_char_pattern(sub).matches(topic):
        assert match_topic_pattern(rule, topic)


def test_config_section_builds_the_policy() -> None:
    cfg = AuthorisationConfig.model_validate(
        {
            "rules": [
                {"users": "app1", "actions": ["publish"], "streams": STOCK, "topics": "IBM/#"},
                {"users": ["*"], "allow": False},
            ],
            "default_allow": False,
            "plugins": {"k1": {"rules": [{"streams": [STOCK]}], "default_allow": False}},
            "subscriber_queues": {"deny": ["X.*"]},
        }
    )
    policy = cfg.policy()
    assert policy.rules[0] == Rule(frozenset({Action.PUBLISH}), (STOCK,), ("IBM/#",), ("app1",))
    assert policy.plugin_defaults == {"k1": False}
    assert policy.queue_deny == ("X.*",)
    assert AuthorisationConfig().policy() == Policy()
    with pytest.raises(ValueError, match="extra"):
        AuthorisationConfig.model_validate({"rulez": []})


# ------------------------------------------------------------------ the engine -------


def engine(policy: Policy | None = None) -> PubSubEngine:
    return PubSubEngine(
        "QM1",
        MemoryStore(),
        broker_queues=[STOCK],
        authoriser=authoriser(policy, gateway_users=["mqgw"]),
    )


def refused(out: Outcome) -> dict[str, str]:
    """The MQRFH response of a refused command, after checking the dead letter."""
    assert out.dead_letter is not None and out.dead_letter.reason == NOT_AUTHORIZED
    assert out.response is not None and out.deliveries == [] and out.mutations == []
    return dict(decode(out.response.md, out.response.body).pairs)


def test_publish_on_the_admin_stream_is_refused_and_dead_lettered() -> None:
    e = engine()
    e.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSStreamName", ADMIN), ("MQPSTopic", "*")],
            reply_to_q="SUB.Q",
        )
    )
    e.commit()
    assert len(e.subscriptions) == 1
    out = e.handle(
        rfh_message(
            ADMIN,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "MQ/SA/Broker/x")],
            b"forged",
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        )
    )
    answer = refused(out)
    assert answer["MQPSReason"] == "3081"
    assert answer["MQPSReasonText"] == "MQRCCF_NOT_AUTHORIZED"
    assert e.authoriser is not None
    assert e.authoriser.refusals == {("mq", "protected_stream"): 1}


def test_rfh2_publish_naming_the_admin_stream_is_refused() -> None:
    e = engine()
    out = e.handle(
        rfh2_message(
            CONTROL,
            [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{ADMIN}/x")],
            b"forged",
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        )
    )
    assert out.dead_letter is not None and out.dead_letter.reason == NOT_AUTHORIZED
    assert out.response is not None
    pscr = decode(out.response.md, out.response.body)
    assert pscr.get("pscr/Response/Reason") == "3081"
    assert pscr.get("pscr/Completion") == "error"


def test_neighbour_publication_on_the_admin_stream_is_accepted() -> None:
    e = engine()
    e.set_neighbours(
        {"QM2": Neighbour("QM2", NeighbourKind.GATEWAY, NeighbourRole.CHILD, frozenset({ADMIN}))}
    )
    out = e.handle(
        rfh_message(
            ADMIN,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "MQ/SA/x"), ("MQPSPubOpts", "NoReg")],
            b"metadata",
            reply_to_q_mgr="QM2",
        )
    )
    assert out.dead_letter is None


@pytest.mark.parametrize("queue", ["SYSTEM.ADMIN.COMMAND.QUEUE", STOCK, "QM2.XMITQ"])
def test_regsub_of_a_forbidden_subscriber_queue_is_refused(queue: str) -> None:
    e = engine()
    out = e.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "t"), ("MQPSQName", queue)],
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        )
    )
    answer = refused(out)
    assert answer["MQPSReason"] == "3081" and answer["MQPSParmId"] == "MQPSQName"
    assert e.subscriptions == []


def test_rules_bind_regsub_dereg_and_request_update() -> None:
    policy = Policy(
        rules=(Rule(frozenset({Action.SUBSCRIBE}), (STOCK,), ("Stock/#",), ("app1",)),),
        default_allow=False,
    )
    e = engine(policy)

    def cmd(command: str, topic: str, user: str = "app1") -> Outcome:
        return e.handle(
            rfh_message(
                CONTROL,
                [("MQPSCommand", command), ("MQPSStreamName", STOCK), ("MQPSTopic", topic)],
                reply_to_q="SUB.Q",
                msg_type=MsgType.REQUEST,
                user_identifier=user,
            )
        )

    assert cmd("RegSub", "Stock/IBM").dead_letter is None
    e.commit()
    assert refused(cmd("RegSub", "Bonds/*"))["MQPSReason"] == "3081"
    assert refused(cmd("RegSub", "Stock/IBM", user="intruder"))["MQPSReason"] == "3081"
    assert refused(cmd("ReqUpdate", "Stock/IBM", user="intruder"))["MQPSReason"] == "3081"
    assert refused(cmd("DeregSub", "Stock/IBM", user="intruder"))["MQPSReason"] == "3081"
    assert cmd("DeregSub", "Stock/IBM").dead_letter is None
    assert e.authoriser is not None
    assert e.authoriser.refusals == {("mq", "no_rule"): 4}


def test_without_an_authoriser_the_engine_is_unchanged() -> None:
    e = PubSubEngine("QM1", MemoryStore())
    out = e.handle(rfh_message(ADMIN, [("MQPSCommand", "Publish"), ("MQPSTopic", "x")], b"x"))
    assert out.dead_letter is None
