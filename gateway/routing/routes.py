"""The ``request_reply:`` section of ``gateway.yaml``: requester and service routes.

Why here and not in gateway/runtime/config.py: the pure core (addressing, correlation)
reads these models, and the core sits below the runtime. The runtime embeds
:class:`RequestReplyConfig` in its ``GatewayConfig`` and adds the checks that need other
sections (plugin instance exists, implements Exchanges). docs/request-reply.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.pubsub.topics import match_topic_pattern
from gateway.wire.constants import Q_MGR_NAME_LENGTH, Q_NAME_LENGTH

__all__ = [
    "ROUTE_NAME",
    "ReportOption",
    "RequestReplyConfig",
    "RequestRoute",
    "ServiceRoute",
    "split_destination",
]

#: A route name: used in logs, metrics labels and correlation-store rows.
ROUTE_NAME = r"^[A-Za-z0-9_.-]{1,64}$"
#: Characters IBM MQ allows in queue and queue-manager names.
_MQ_NAME = re.compile(r"^[A-Za-z0-9._/%]+$")

#: A topic name of only the characters Kafka allows (no MQTT levels).
_PLAIN_TOPIC = re.compile(r"[A-Za-z0-9._-]+")

ReportOption = Literal["exception", "expiration", "coa", "cod"]


def _check_mq_name(name: str, what: str, limit: int) -> None:
    if not 1 <= len(name) <= limit or not _MQ_NAME.match(name):
        raise ValueError(f"{what} {name!r} must be 1 to {limit} characters of A-Z a-z 0-9 . / _ %")


def _default_report() -> list[ReportOption]:
    return ["exception", "expiration"]


def split_destination(text: str) -> tuple[str, str]:
    """``"Q@QM"`` -> ``("Q", "QM")``; ``"Q"`` -> ``("Q", "")`` (the QM resolves it).

    Raises ValueError for an empty or over-long name, or more than one ``@``.
    """
    queue, sep, q_mgr = text.partition("@")
    _check_mq_name(queue, "queue name", Q_NAME_LENGTH)
    if sep:
        _check_mq_name(q_mgr, "queue manager name", Q_MGR_NAME_LENGTH)
    return queue, q_mgr


def _matches(source: str, topic: str) -> bool:
    """``topic`` is ``source``, or matched by it as an MQTT filter."""
    if source == topic:
        return True
    return ("+" in source or "#" in source) and match_topic_pattern(source, topic)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RequestRoute(_Strict):
    """Gateway as requester: requests consumed from a plugin are put to an MQ service."""

    name: str = Field(pattern=ROUTE_NAME)
    """The route's name, unique over requests and services; also its durable consumer's name."""
    plugin: str = Field(min_length=1)
    """Plugin instance name (its plugin must implement Exchanges)."""
    source: str = Field(min_length=1)
    """Kafka topic / MQTT topic filter the requests arrive on."""
    destination: str
    """"Q" or "Q@QMGR", resolved by the gateway's queue manager."""
    timeout: float = Field(default=30.0, gt=0)
    """Seconds without a reply before the requester gets the error reply "timeout"."""
    expiry: float | None = Field(default=None, gt=0)
    """Seconds put as MQMD Expiry when the request names none (None: unlimited)."""
    report: list[ReportOption] = Field(default_factory=lambda: _default_report())
    """Report options asked for in each request: ``exception``, ``expiration``, ``coa``,
    ``cod``."""
    correlation: Literal["msg_id", "correl_id"] = "msg_id"
    """msg_id: the service copies our MsgId into the reply's CorrelId (MQ's default);
    correl_id: we ask PASS_CORREL_ID and send our token as CorrelId."""
    reply_topic: str | None = Field(default=None, min_length=1)
    """Reply topic when a request carries none (MQTT 3.1.1); "{topic}" = request's topic.
    None: :meth:`default_reply_topic` picks one valid for the request's kind."""
    reply_topics: list[str] = Field(default_factory=list)
    """Globs a reply topic a requester names must match (``*`` any characters, ``/``
    included); empty: any topic that is not the gateway's own (docs/security.md)."""
    persistent: bool = True
    """MQMD Persistence of the requests."""

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str) -> str:
        split_destination(value)
        return value

    @field_validator("report")
    @classmethod
    def _unique_report(cls, value: list[ReportOption]) -> list[ReportOption]:
        if len(set(value)) != len(value):
            raise ValueError(f"report lists an option twice: {value}")
        return value

    def default_reply_topic(self, topic: str) -> str:
        """The reply topic for a request on ``topic`` that names none: the route's
        template, else ``{topic}.reply`` for a plain name (every Kafka topic: Kafka
        refuses "/") and ``{topic}/reply`` for a topic with levels (MQTT), one level
        below the request, outside a source such as ``quotes/+``."""
        if self.reply_topic is not None:
            return self.reply_topic.replace("{topic}", topic)
        if _PLAIN_TOPIC.fullmatch(topic):
            return f"{topic}.reply"
        return f"{topic}/reply"


class ServiceRoute(_Strict):
    """Gateway as service: MQ requests on ``queue`` are answered by a plugin responder."""

    name: str = Field(pattern=ROUTE_NAME)
    """The route's name, unique over requests and services."""
    queue: str
    """Queue on the gateway's queue manager the requests are got from."""
    plugin: str = Field(min_length=1)
    """The plugin instance requests are produced through."""
    target: str = Field(min_length=1)
    """Kafka topic / MQTT topic the requests are produced to."""
    replies: str = Field(min_length=1)
    """Kafka topic / MQTT topic the responders answer on."""
    timeout: float = Field(default=30.0, gt=0)
    """Seconds without a reply (or the request's own expiry, if sooner) before the
    requester gets an expiration report (when it asked for one)."""

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        _check_mq_name(value, "queue name", Q_NAME_LENGTH)
        return value


class RequestReplyConfig(_Strict):
    """Request/reply across MQ and the plugins' brokers (docs/request-reply.md)."""

    reply_queue: str = "MQGW.REPLY"
    """Local queue replies and reports arrive on (the embedded QM defines it if missing)."""
    reply_to_q: str = ""
    """ReplyToQ put in requests ("" = reply_queue); may name a reply-to queue alias."""
    reply_to_q_mgr: str = ""
    """ReplyToQMgr put in requests ("" = the queue manager fills in its own name)."""
    store: Path = Path("data/request_reply.db")
    """The correlation store (SQLite, one process at a time), relative to the config file."""
    retention: float = Field(default=600.0, ge=0)
    """Seconds finished entries are kept to filter duplicates."""
    sweep_interval: float = Field(default=0.5, gt=0)
    """Seconds between timeout sweeps."""
    undeliverable_after: float = Field(default=300.0, ge=0)
    """Seconds the sweeper keeps trying an entry's error reply or expiration report
    (with a backoff) after its destination first refused it, before it gives the
    entry up as ``undeliverable``: a reply topic or ReplyToQ that keeps refusing (an
    outsider names it) must not keep the entry, and its retries, for ever. Outages of
    the plugin or the queue manager do not count: they are retried until they end."""
    requests: list[RequestRoute] = Field(default_factory=list)
    """Requester routes: requests from a plugin's broker to an MQ service."""
    services: list[ServiceRoute] = Field(default_factory=list)
    """Service routes: MQ requests to a responder on a plugin's broker."""

    @field_validator("reply_queue")
    @classmethod
    def _reply_queue(cls, value: str) -> str:
        _check_mq_name(value, "reply_queue", Q_NAME_LENGTH)
        return value

    @field_validator("reply_to_q")
    @classmethod
    def _reply_to_q(cls, value: str) -> str:
        if value:
            _check_mq_name(value, "reply_to_q", Q_NAME_LENGTH)
        return value

    @field_validator("reply_to_q_mgr")
    @classmethod
    def _reply_to_q_mgr(cls, value: str) -> str:
        if value:
            _check_mq_name(value, "reply_to_q_mgr", Q_MGR_NAME_LENGTH)
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> RequestReplyConfig:
        seen: set[str] = set()
        routes: list[RequestRoute | ServiceRoute] = [*self.requests, *self.services]
        for route in routes:
            if route.name in seen:
                raise ValueError(f"route name {route.name!r} is used twice")
            seen.add(route.name)
        return self

    def route_topic(self, topic: str) -> str:
        """Why ``topic`` belongs to a route (a requester route's source, a service
        route's target or replies topic), or "": a reply written there would come back
        as a request, a request to a responder, or a responder's reply. Every route is
        asked, whatever its plugin instance (two instances may share a cluster or a
        broker). A source with MQTT wildcards (``+``, ``#``) owns what it matches."""
        for req in self.requests:
            if _matches(req.source, topic):
                return f"it is the source of requester route {req.name!r}"
        for svc in self.services:
            if topic == svc.target:
                return f"it is the target of service route {svc.name!r}"
            if _matches(svc.replies, topic):
                return f"it is the replies topic of service route {svc.name!r}"
        return ""

    @property
    def effective_reply_to_q(self) -> str:
        """ReplyToQ to put in requests: ``reply_to_q`` or else ``reply_queue``."""
        return self.reply_to_q or self.reply_queue
