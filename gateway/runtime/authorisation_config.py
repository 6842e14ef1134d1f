"""The ``authorisation:`` section of gateway.yaml and the :class:`Policy` it makes.

Why its own module: the section is a small language of its own (rules read top to
bottom, globs, MQ topic patterns); keeping it apart from ``config.py`` keeps that file
about the gateway's shape. The pure policy lives in :mod:`gateway.pubsub.authorisation`;
docs/security.md ("Stream and topic authorisation") and docs/config-reference.md
describe every key; ``gateway.runtime.authorisation`` builds the running gateway's
authoriser from it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.pubsub.authorisation import Action, Policy, Rule

__all__ = [
    "AuthorisationConfig",
    "PluginAuthorisation",
    "ReplyQueuesConfig",
    "RuleConfig",
    "SubscriberQueuesConfig",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


_ActionName = Literal["publish", "subscribe"]
_BOTH: tuple[_ActionName, ...] = ("publish", "subscribe")


def _names(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


class RuleConfig(_Strict):
    """One rule: ``users`` (MQMD UserIdentifier globs) may (``allow: true``) or may not
    ``publish``/``subscribe`` on ``streams`` (globs) within ``topics`` (MQ patterns)."""

    users: str | list[str] = "*"
    """User identifiers (``*`` any, ``?`` one character); ignored in a plugin's rules."""
    actions: list[_ActionName] = Field(default_factory=lambda: [*_BOTH], min_length=1)
    """``publish`` (Publish, DeletePub) and/or ``subscribe`` (RegSub, DeregSub, ReqUpdate)."""
    streams: str | list[str] = "*"
    """Stream name(s), globs."""
    topics: str | list[str] = "#"
    """MQ topic pattern(s) (``#``, ``+``): a published topic must match one; a subscription's
    pattern must stay within one."""
    allow: bool = True
    """``false`` makes it a deny rule (reason ``denied_by_rule``)."""

    @field_validator("users", "streams", "topics")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        names = _names(value)
        if not names or any(not n for n in names):
            raise ValueError("must name at least one (use '*' or '#' for any)")
        return value

    def to_rule(self) -> Rule:
        return Rule(
            actions=frozenset(Action(a) for a in self.actions),
            streams=tuple(_names(self.streams)),
            topics=tuple(_names(self.topics)),
            who=tuple(u.strip() for u in _names(self.users)),
            allow=self.allow,
        )


class PluginAuthorisation(_Strict):
    """What one plugin instance may publish (its inbound side)."""

    rules: list[RuleConfig] = Field(default_factory=list)
    """What the instance's inbound publications may be, read top to bottom (``users`` ignored)."""
    default_allow: bool = True
    """Without a matching rule: allow (true) or refuse."""


class SubscriberQueuesConfig(_Strict):
    """Queues MQ applications may name as subscriber queues, beyond the fixed rules
    (never SYSTEM.*, a broker-serviced queue or a transmission queue)."""

    deny: list[str] = Field(default_factory=list)
    """Globs on ``QUEUE`` or ``QMGR/QUEUE``: a match is refused."""
    allow: list[str] = Field(default_factory=list)
    """When not empty, only a matching queue is accepted."""


class ReplyQueuesConfig(_Strict):
    """Queues MQ requesters of a service route may name as ReplyToQ, beyond the fixed
    rule (never one of the gateway's own queues, nor a SYSTEM. queue anywhere)."""

    deny: list[str] = Field(default_factory=list)
    """Globs on ``QUEUE`` or ``QMGR/QUEUE``: a match is refused."""
    allow: list[str] = Field(default_factory=list)
    """When not empty, only a matching queue is accepted."""


class AuthorisationConfig(_Strict):
    """The ``authorisation:`` section (the defaults are the safe policy of a new
    install: see docs/security.md)."""

    enabled: bool = True
    """false: everything allowed (the behaviour before issue 15); not for production."""
    protected_streams: list[str] = Field(default_factory=lambda: ["SYSTEM.*"])
    """Streams (globs) only neighbour brokers may publish on (the default stream never is)."""
    rules: list[RuleConfig] = Field(default_factory=list)
    """MQ applications: the first rule naming the user, the action, the stream and
    covering the topic decides; with none, ``default_allow``."""
    default_allow: bool = True
    """Without a matching rule: allow (``true``) or refuse (reason ``no_rule``)."""
    plugins: dict[str, PluginAuthorisation] = Field(default_factory=dict)
    """Plugin instance name -> what it may publish (instances not listed: allowed)."""
    subscriber_queues: SubscriberQueuesConfig = Field(default_factory=SubscriberQueuesConfig)
    """Which queues MQ applications may name as subscriber queues."""
    reply_queues: ReplyQueuesConfig = Field(default_factory=ReplyQueuesConfig)
    """Which reply-to queues a request a service route forwards may name."""
    trust_neighbours: bool = True
    """Neighbour brokers (configured or joined) may publish and subscribe anywhere."""
    gateway_user_ids: list[str] = Field(default_factory=list)
    """User identifiers the queue manager gives the gateway's own connections, besides
    the embedded queue manager's (the process user) and queue_manager.user."""

    def policy(self) -> Policy:
        return Policy(
            enabled=self.enabled,
            protected_streams=tuple(self.protected_streams),
            rules=tuple(r.to_rule() for r in self.rules),
            default_allow=self.default_allow,
            plugin_rules={
                name: tuple(r.to_rule() for r in p.rules) for name, p in self.plugins.items()
            },
            plugin_defaults={name: p.default_allow for name, p in self.plugins.items()},
            trust_neighbours=self.trust_neighbours,
            queue_allow=tuple(self.subscriber_queues.allow),
            queue_deny=tuple(self.subscriber_queues.deny),
            reply_queue_allow=tuple(self.reply_queues.allow),
            reply_queue_deny=tuple(self.reply_queues.deny),
        )
