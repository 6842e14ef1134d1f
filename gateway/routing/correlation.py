"""Correlation entries: what the gateway remembers between a request and its reply.

Why deterministic tokens: a request redelivered after a crash (the source was not yet
acknowledged) must map to the same entry and the same MQ MsgId, so the store can filter
it and a late reply still finds its entry. The identity of an incoming request is
:func:`source_id`; :func:`request_token` hashes it to the 24 bytes MQ carries.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from gateway.plugin_api import Envelope

__all__ = [
    "TOKEN_LENGTH",
    "PendingRequest",
    "PendingService",
    "Side",
    "State",
    "request_token",
    "source_id",
]

#: MsgId / CorrelId length.
TOKEN_LENGTH = 24


class Side(StrEnum):
    """Which end of the exchange the gateway plays."""

    REQUESTER = "requester"
    SERVICE = "service"


class State(StrEnum):
    """OPEN: waiting for the answer. DONE: replied, reported, timed out, dead-lettered or
    given up (``undeliverable``)."""

    OPEN = "open"
    DONE = "done"


@dataclass(slots=True)
class PendingRequest:
    """The gateway as requester: a plugin's request put to an MQ service."""

    #: 24 bytes: what the reply's CorrelId will be.
    key: bytes
    route: str
    #: Dedup identity of the incoming request (:func:`source_id`).
    source_id: str
    #: Where the reply goes (the route's default already applied).
    reply_topic: str
    #: The requester's correlation data, returned unchanged.
    correlation_data: bytes
    #: MsgId of the MQ request the gateway put.
    msg_id: bytes
    #: Epoch seconds: no reply by then -> error reply "timeout".
    deadline: float
    state: State = State.OPEN
    #: "reply" | "timeout" | "expired" | "exception" | "refused" | "undeliverable" | ...
    outcome: str = ""
    #: The MQ put of the request has committed.
    sent: bool = False
    #: Sweeps that tried to finish it (its error reply) and could not.
    attempts: int = 0
    #: Epoch seconds of the sweeper's next try after a failed one (None: at the deadline).
    retry_at: float | None = None
    #: Epoch seconds its destination (the reply topic) first refused the sweeper's try;
    #: None while only outages failed it (``undeliverable_after`` counts from here).
    refused_since: float | None = None


@dataclass(slots=True)
class PendingService:
    """The gateway as service provider: an MQ request handed to a plugin responder."""

    #: 24 bytes = the request's MsgId; sent to the responder as correlation data.
    token: bytes
    route: str
    msg_id: bytes
    correl_id: bytes
    reply_to_q: str
    reply_to_q_mgr: str
    report: int
    persistence: int
    priority: int
    #: Epoch seconds when the request's own Expiry runs out (None: unlimited).
    expiry_at: float | None
    deadline: float
    state: State = State.OPEN
    outcome: str = ""
    #: The request has been produced to the responder (the entry is recorded before).
    produced: bool = True
    #: Sweeps that tried to finish it (its expiration report) and could not.
    attempts: int = 0
    #: Epoch seconds of the sweeper's next try after a failed one (None: at the deadline).
    retry_at: float | None = None
    #: Epoch seconds its destination (the ReplyToQ) first refused the sweeper's try;
    #: None while only outages failed it (``undeliverable_after`` counts from here).
    refused_since: float | None = None


def request_token(source_id: str) -> bytes:
    """sha256(source_id)[:24]: the same request always gets the same MsgId/token."""
    return hashlib.sha256(source_id.encode("utf-8")).digest()[:TOKEN_LENGTH]


def source_id(route: str, env: Envelope) -> str:
    """The identity of an incoming request, stable across redeliveries.

    In order of preference: the plugin's receive identity (``env.msg_id``, e.g. Kafka
    topic/partition/offset), the requester's reply topic + correlation data, and last
    the topic, payload digest and put time.
    """
    if env.msg_id:
        return f"{route}|id|{env.msg_id.hex()}"
    if env.correlation_data:
        return f"{route}|{env.reply_topic}|{env.correlation_data.hex()}"
    digest = hashlib.sha256(env.payload).hexdigest()
    put_time = "" if env.put_time_ms is None else str(env.put_time_ms)
    return f"{route}|{env.topic}|{digest}|{put_time}"
