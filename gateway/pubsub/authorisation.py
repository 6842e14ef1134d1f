"""Stream and topic authorisation: who may publish and subscribe on which stream and
topic, and which queues may be subscriber queues (sans-I/O, synchronous, pure).

Why a policy object apart from the handlers: every entrance asks the same questions —
the pub/sub command handlers for MQ applications and neighbour brokers, the plugin
host for each plugin instance — and a refusal must carry the same reason wherever it
happens (the MQ response, the dead-letter entry, the counter, the log line). The
runtime builds a :class:`Policy` from the ``authorisation:`` section of gateway.yaml
(``gateway.runtime.authorisation_config``); docs/security.md describes the model.

Who asks (:class:`Principal`):

* ``user`` — an MQ application, named by the MQMD UserIdentifier the queue manager set
  (trailing blanks trimmed);
* ``plugin`` — a plugin instance of this gateway (its inbound publications);
* ``neighbour`` — a neighbour broker configured or joined (docs/neighbours.md): trusted
  for everything while ``trust_neighbours`` holds (the default);
* ``broker`` — the gateway itself (a command put under one of its own user
  identifiers, without a plugin's origin marker): always trusted.

Rules are read top to bottom, the first rule naming the principal, the action, the
stream and covering the topic decides; with none, ``default_allow`` (users) or the
plugin instance's default decides. Whatever the rules say, nobody but a
neighbour broker publishes on a *protected* stream (``SYSTEM.*`` by default, the
default stream excepted), and no subscriber queue is a ``SYSTEM.*`` queue (another
broker's inter-broker queue aside: its proxy subscriptions), a queue the broker
services (stream queues, its dead-letter queue) or a transmission queue.
"""

from __future__ import annotations

import enum
import fnmatch
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from gateway.pubsub.destinations import (
    KEPT_QUEUE,
    SYSTEM_QUEUE,
    TRANSMISSION_QUEUE,
    OwnQueue,
    OwnQueues,
    QueueUse,
    ResolvedQueue,
)
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.pubsub.topics import Scheme, match_topic_pattern
from gateway.wire.reasons import Reason, reason_text

log = logging.getLogger(__name__)

__all__ = [
    "Action",
    "Authoriser",
    "Decision",
    "Policy",
    "Principal",
    "PrincipalKind",
    "Refusal",
    "Rule",
    "topic_pattern_covers",
]


class Action(enum.StrEnum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"


class PrincipalKind(enum.StrEnum):
    USER = "user"
    PLUGIN = "plugin"
    NEIGHBOUR = "neighbour"
    #: the gateway itself (its own connections: stream-support publications, proxies)
    BROKER = "broker"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who asks: an MQ user identifier, a plugin instance or a neighbour broker."""

    kind: PrincipalKind
    name: str

    @classmethod
    def user(cls, user_identifier: str) -> Principal:
        """The MQMD UserIdentifier as the queue manager set it, blanks trimmed."""
        return cls(PrincipalKind.USER, user_identifier.strip())

    def __str__(self) -> str:
        if self.kind is PrincipalKind.USER:
            return f"user {self.name!r}"
        if self.kind is PrincipalKind.PLUGIN:
            return f"plugin instance {self.name!r}"
        if self.kind is PrincipalKind.BROKER:
            return f"the gateway itself (user {self.name!r})"
        return f"neighbour broker {self.name}"


class Refusal(enum.StrEnum):
    """Why something was refused: the ``reason`` label of the refusal counter."""

    PROTECTED_STREAM = "protected_stream"
    DENIED_BY_RULE = "denied_by_rule"
    NO_RULE = "no_rule"
    SYSTEM_QUEUE = "system_queue"
    BROKER_QUEUE = "broker_queue"
    TRANSMISSION_QUEUE = "transmission_queue"
    QUEUE_DENIED = "queue_denied"
    QUEUE_NOT_LISTED = "queue_not_listed"
    STREAM_NOT_IN_ROUTE = "stream_not_in_route"
    #: a topic a plugin instance or a route keeps for itself (a requester's reply topic)
    OWN_TOPIC = "own_topic"
    #: a reply topic outside a requester route's ``reply_topics``
    TOPIC_NOT_LISTED = "topic_not_listed"
    #: a RegSub/DeregSub naming a sink's backlog queue without the gateway's seal
    #: (gateway/runtime/sink_command_seal.py), a stale one, a DeregAll, or for a stream
    #: not ``sinks: owner`` here
    SINK_SUBSCRIPTION = "sink_subscription"


#: The refusal of each kind of :class:`~gateway.pubsub.destinations.OwnQueue`.
_OWN_QUEUE_REFUSAL = {
    SYSTEM_QUEUE: Refusal.SYSTEM_QUEUE,
    KEPT_QUEUE: Refusal.BROKER_QUEUE,
    TRANSMISSION_QUEUE: Refusal.TRANSMISSION_QUEUE,
}


def own_queue_refusal(own: OwnQueue) -> Refusal:
    """The refusal reason of a queue that is (or resolves to) one of the gateway's own."""
    return _OWN_QUEUE_REFUSAL[own.kind]


@dataclass(frozen=True, slots=True)
class Decision:
    """Allowed or not, and why (``detail`` is one sentence for logs and dead letters)."""

    allowed: bool
    detail: str
    reason: Refusal | None = None

    def __bool__(self) -> bool:
        return self.allowed


_ALLOWED = Decision(True, "allowed")


@dataclass(frozen=True, slots=True)
class Rule:
    """One line of the policy. ``who`` are user identifiers (``*``/``?`` globs; unused
    in a plugin instance's own rules); ``streams`` are stream names (globs); ``topics``
    are MQ topic patterns (``#``, ``+``) a published topic must match and a
    subscription's pattern must stay within."""

    actions: frozenset[Action]
    streams: tuple[str, ...] = ("*",)
    topics: tuple[str, ...] = ("#",)
    who: tuple[str, ...] = ("*",)
    allow: bool = True

    def names(self, principal: str) -> bool:
        return any(fnmatch.fnmatchcase(principal, w) for w in self.who)

    def applies(self, action: Action, stream: str, topic: str, *, pattern: Scheme | None) -> bool:
        """True when this rule speaks about ``action`` on ``stream`` and ``topic`` (a
        subscription's pattern when ``pattern`` gives its scheme)."""
        if action not in self.actions:
            return False
        if not any(fnmatch.fnmatchcase(stream, s) for s in self.streams):
            return False
        if pattern is None:
            return any(match_topic_pattern(t, topic) for t in self.topics)
        return any(topic_pattern_covers(t, topic, pattern) for t in self.topics)


def _unescape_char(pattern: str) -> str:
    """An MQRFH character pattern without wildcards, ``%`` escapes removed."""
    out: list[str] = []
    escaped = False
    for ch in pattern:
        if ch == "%" and not escaped:
            escaped = True
            continue
        escaped = False
        out.append(ch)
    return "".join(out)


def _first_char_wildcard(pattern: str) -> int:
    escaped = False
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "%":
            escaped = True
        elif ch in "*?":
            return i
    return -1


def topic_pattern_covers(rule: str, sub: str, scheme: Scheme = Scheme.TOPIC) -> bool:
    """True when every topic ``sub`` (a subscription's pattern in ``scheme``) can match
    is matched by ``rule`` (an MQ topic pattern). Conservative: False when unsure.

    Topic scheme: level by level, ``#`` in the rule covers the rest; ``+`` covers one
    level that is not ``#``; a literal level covers itself only. Character scheme
    (MQRFH ``*``, ``?``, ``%``): a pattern without wildcards is a topic; one with
    wildcards is covered only by a rule ending in ``#`` whose literal levels are a
    whole-level prefix of the text before its first wildcard.
    """
    r_levels = rule.split("/")
    if scheme is Scheme.CHAR:
        cut = _first_char_wildcard(sub)
        if cut < 0:
            return match_topic_pattern(rule, _unescape_char(sub))
        if r_levels[-1] != "#" or any(lv in ("+", "#") for lv in r_levels[:-1]):
            return False
        prefix = _unescape_char(sub[:cut])
        head = "/".join(r_levels[:-1])
        return not head or prefix.startswith(head + "/")
    s_levels = sub.split("/")
    if not any(lv in ("+", "#") for lv in s_levels):
        return match_topic_pattern(rule, sub)
    for i, r in enumerate(r_levels):
        if r == "#":
            return i == len(r_levels) - 1  # a '#' before other levels: unsure
        if i >= len(s_levels):
            return False
        s = s_levels[i]
        if r == "+":
            if s == "#":
                return False
            continue
        if s != r:
            return False
    return len(s_levels) == len(r_levels)


@dataclass(frozen=True, slots=True)
class Policy:
    """The whole authorisation policy (see the module docstring); the defaults are the
    safe policy of a new install (docs/security.md)."""

    enabled: bool = True
    #: Streams (globs) only neighbour brokers publish on; the default stream never is.
    protected_streams: tuple[str, ...] = ("SYSTEM.*",)
    #: Users: first matching rule decides, else ``default_allow``.
    rules: tuple[Rule, ...] = ()
    default_allow: bool = True
    #: Plugin instance -> its rules (``who`` unused); with none matching, its entry in
    #: ``plugin_defaults`` decides (an instance not listed there: allowed).
    plugin_rules: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)
    plugin_defaults: Mapping[str, bool] = field(default_factory=dict)
    trust_neighbours: bool = True
    #: Subscriber queues (globs, ``QUEUE`` or ``QMGR/QUEUE``): a queue matching ``deny``
    #: is refused; with ``allow`` non-empty, only a matching queue is accepted.
    queue_allow: tuple[str, ...] = ()
    queue_deny: tuple[str, ...] = ()
    #: Reply-to queues of requests a service route forwards: the same kind of globs.
    reply_queue_allow: tuple[str, ...] = ()
    reply_queue_deny: tuple[str, ...] = ()

    def is_protected(self, stream: str) -> bool:
        if stream == DEFAULT_STREAM:
            return False
        return any(fnmatch.fnmatchcase(stream, p) for p in self.protected_streams)


class Authoriser:
    """Answers the policy's questions, counts refusals and reports them.

    ``q_mgr_name`` is this broker's queue manager (a blank queue manager in a
    subscriber's identity means it); ``own_queues`` are the queues the gateway keeps
    for itself and MQ's name resolution (:mod:`gateway.pubsub.destinations`), or, for a
    policy alone, ``broker_queues`` (stream queues, its dead-letter queue) and
    ``is_transmission_queue`` resolved by name. ``gateway_users`` are the user
    identifiers the queue manager gives the gateway's own connections: a command put
    under one of them is the gateway's (trusted), or, marked with a plugin instance's
    origin, that instance's (the marker counts only then: anyone can write it).
    ``refusals`` counts (entrance, reason) for the metrics; ``report`` is told of each
    refusal (the runtime logs them, summarised: an outsider decides how many there are).
    """

    def __init__(
        self,
        policy: Policy,
        q_mgr_name: str = "",
        broker_queues: Collection[str] = (),
        is_transmission_queue: Callable[[str], bool] = lambda queue: False,
        gateway_users: Collection[str] = (),
        *,
        own_queues: OwnQueues | None = None,
        report: Callable[[str, Decision, int], None] | None = None,
    ) -> None:
        self.policy = policy
        self.gateway_users = frozenset(u.strip() for u in gateway_users if u.strip())
        self.q_mgr_name = q_mgr_name.strip()
        self.own_queues = own_queues or OwnQueues(
            self.q_mgr_name, broker_queues, is_transmission_queue=is_transmission_queue
        )
        self.refusals: Counter[tuple[str, str]] = Counter()
        self.report = report or _log_refusal

    def principal_of(
        self, user_identifier: str, *, origin: str = "", neighbour: str = ""
    ) -> Principal:
        """Who sent a command: the neighbour broker it came from; else, put under one of
        the gateway's own user identifiers, the plugin instance its origin marker names
        or the gateway itself; else the user."""
        if neighbour:
            return Principal(PrincipalKind.NEIGHBOUR, neighbour)
        user = user_identifier.strip()
        if user in self.gateway_users:
            if origin:
                return Principal(PrincipalKind.PLUGIN, origin)
            return Principal(PrincipalKind.BROKER, user)
        return Principal(PrincipalKind.USER, user)

    def _trusted(self, principal: Principal) -> bool:
        if principal.kind is PrincipalKind.BROKER:
            return True
        return principal.kind is PrincipalKind.NEIGHBOUR and self.policy.trust_neighbours

    def count(
        self, entrance: str, decision: Decision, code: int = Reason.CF_NOT_AUTHORIZED
    ) -> None:
        """Count a refusal at ``entrance`` (``mq``, ``plugin:<instance>``,
        ``request_reply:<route>``) and report it with the MQ reason ``code`` the refused
        party gets (0: none, nothing was answered)."""
        if not decision.allowed and decision.reason is not None:
            self.refusals[(entrance, decision.reason.value)] += 1
            self.report(entrance, decision, code)

    # ---------------------------------------------------------------- streams/topics --

    def may_publish(
        self, principal: Principal, stream: str, topic: str, scheme: Scheme | None = None
    ) -> Decision:
        """May ``principal`` publish on ``topic`` of ``stream``? A literal topic, or with
        ``scheme`` a pattern (DeletePub: every topic it can match must be allowed)."""
        return self._decide(principal, Action.PUBLISH, stream, topic, scheme)

    def may_subscribe(
        self, principal: Principal, stream: str, pattern: str, scheme: Scheme = Scheme.TOPIC
    ) -> Decision:
        """May ``principal`` subscribe to ``pattern`` (in ``scheme``) of ``stream``?"""
        return self._decide(principal, Action.SUBSCRIBE, stream, pattern, scheme)

    def _decide(
        self,
        principal: Principal,
        action: Action,
        stream: str,
        topic: str,
        scheme: Scheme | None,
    ) -> Decision:
        policy = self.policy
        if not policy.enabled:
            return _ALLOWED
        if self._trusted(principal):
            return _ALLOWED
        what = f"{action.value} on stream {stream} topic {topic!r}"
        if action is Action.PUBLISH and policy.is_protected(stream):
            return Decision(
                False,
                f"{principal} may not {what}: stream {stream} is protected "
                "(only neighbour brokers publish there)",
                Refusal.PROTECTED_STREAM,
            )
        if principal.kind is PrincipalKind.PLUGIN:
            rules = policy.plugin_rules.get(principal.name, ())
            default = policy.plugin_defaults.get(principal.name, True)
            named = list(rules)
        else:
            default = policy.default_allow
            named = [r for r in policy.rules if r.names(principal.name)]
        for i, rule in enumerate(named):
            if rule.applies(action, stream, topic, pattern=scheme):
                if rule.allow:
                    return _ALLOWED
                return Decision(
                    False,
                    f"{principal} may not {what}: denied by rule {i + 1} for it",
                    Refusal.DENIED_BY_RULE,
                )
        if default:
            return _ALLOWED
        return Decision(False, f"{principal} may not {what}: no rule allows it", Refusal.NO_RULE)

    # ---------------------------------------------------------------- queues ---------

    def may_use_subscriber_queue(self, principal: Principal, q_mgr: str, queue: str) -> Decision:
        """May ``principal`` name ``queue`` at ``q_mgr`` as a subscriber queue?"""
        return self.may_use_queue(principal, q_mgr, queue, QueueUse.SUBSCRIBER)

    def may_use_queue(
        self,
        principal: Principal,
        q_mgr: str,
        queue: str,
        use: QueueUse,
        resolved: ResolvedQueue | None = None,
    ) -> Decision:
        """May ``principal`` have the gateway put on ``queue`` at ``q_mgr`` for ``use``?

        Never on (or through an alias to) one of the gateway's own queues
        (:class:`~gateway.pubsub.destinations.OwnQueues`); then, for an untrusted
        principal, the allow and deny lists of that use (subscriber or reply-to queues).
        With the policy disabled or a trusted principal, subscriber queues are left to
        the engine's own check (:meth:`PubSubEngine.is_broker_queue`, which refuses the
        gateway's queues to everyone); reply-to queues and destinations are always
        checked: nothing about them is a matter of trust. ``resolved``: where MQOPEN
        resolved the name, when the caller opened it (else the resolver is asked)."""
        policy = self.policy
        checked = use in (QueueUse.REPLY, QueueUse.DESTINATION)
        if not checked and (not policy.enabled or self._trusted(principal)):
            return _ALLOWED
        name, qm = queue.strip(), q_mgr.strip()
        own = self.own_queues.why_own(qm, name, use, resolved)
        if own is not None:
            return Decision(
                False,
                f"{principal} may not use {own.named} as a {use.value}: it {own.why}",
                own_queue_refusal(own),
            )
        if not policy.enabled or self._trusted(principal):
            return _ALLOWED
        if use is QueueUse.SUBSCRIBER:
            allow, deny, key = policy.queue_allow, policy.queue_deny, "subscriber_queues"
        elif use is QueueUse.REPLY:
            allow, deny, key = policy.reply_queue_allow, policy.reply_queue_deny, "reply_queues"
        else:
            return _ALLOWED
        local = not qm or qm == self.q_mgr_name
        where = name if local else f"{name} at {qm}"
        full = f"{qm or self.q_mgr_name}/{name}"

        def listed(patterns: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(full if "/" in p else name, p) for p in patterns)

        if listed(deny):
            return Decision(
                False,
                f"{principal} may not use {where} as a {use.value}: denied by "
                f"authorisation.{key}.deny",
                Refusal.QUEUE_DENIED,
            )
        if allow and not listed(allow):
            return Decision(
                False,
                f"{principal} may not use {where} as a {use.value}: not in "
                f"authorisation.{key}.allow",
                Refusal.QUEUE_NOT_LISTED,
            )
        return _ALLOWED

    def may_use_topic(
        self, principal: Principal, topic: str, own: str, allow: Collection[str] = ()
    ) -> Decision:
        """May ``principal`` have the gateway write to ``topic`` (a reply topic it named,
        in a plugin's topic space)? ``own`` says why the topic is one the instance or a
        route keeps for itself ("" when it is not: the plugin and the runtime know);
        ``allow`` are the route's ``reply_topics`` globs (empty: any other topic)."""
        if own:
            return Decision(
                False, f"{principal} may not have replies written to {topic!r}: {own}",
                Refusal.OWN_TOPIC,
            )
        if allow and not any(fnmatch.fnmatchcase(topic, p) for p in allow):
            return Decision(
                False,
                f"{principal} may not have replies written to {topic!r}: not in the "
                "route's reply_topics",
                Refusal.TOPIC_NOT_LISTED,
            )
        return _ALLOWED


def refusal_line(entrance: str, decision: Decision, code: int) -> str:
    """The log line of a refusal: where, why (the counter's reason and the MQ reason),
    and the detail."""
    reason = decision.reason.value if decision.reason is not None else "refused"
    why = f"{reason}, {reason_text(code)}" if code else reason
    return f"refused at {entrance} ({why}): {decision.detail}"


def _log_refusal(entrance: str, decision: Decision, code: int) -> None:
    log.warning("%s", refusal_line(entrance, decision, code))
