"""What the broker remembers: subscriptions, registered publishers, retained publications.

These are the rows of the durable store (``store.py``). A subscription's destination
is either an MQ queue (the MQRFH/MQRFH2 subscriber of the protocol) or a named
in-process sink (the gateway's own Kafka/MQTT plugins): both are subscribers of the same
engine, matched the same way, and differ only in how a delivery is handed over.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gateway.pubsub.topics import Scheme


class SubFormat(enum.IntEnum):
    """How deliveries to a subscriber are formatted."""

    RFH = 1  # MQRFH v1 name/value pairs (MQ Publish/Subscribe V6 application)
    RFH2 = 2  # MQRFH2 with a psc folder (message broker / MQ V7 application)
    SINK = 3  # in-process sink: the engine hands over the publication itself


@dataclass(frozen=True, slots=True)
class Destination:
    """Where deliveries go: ``(q_mgr, queue)`` for MQ, or ``sink`` for a plugin sink."""

    q_mgr: str = ""
    queue: str = ""
    sink: str = ""

    @property
    def is_sink(self) -> bool:
        return bool(self.sink)

    def __str__(self) -> str:
        return f"sink:{self.sink}" if self.sink else f"{self.queue}@{self.q_mgr or '?'}"


#: Identity of a subscription: stream, scheme, topic pattern, destination, correl id.
SubKey = tuple[str, int, str, str, str, str, bytes]
#: Identity of a registered publisher: stream, topic, q_mgr, queue, correl id.
PubKey = tuple[str, str, str, str, bytes]


@dataclass(slots=True)
class Subscription:
    """One registered topic of one subscriber (reference §5.4 RegSub).

    ``correl_id`` is part of the identity only with CorrelAsId (empty bytes otherwise).
    The context fields are the registering command's, copied into every forwarded
    publication (reference §5.7).
    """

    stream: str
    topic: str
    scheme: Scheme
    destination: Destination
    fmt: SubFormat
    correl_id: bytes = b""
    reg_opts: int = 0
    sub_name: str = ""
    sub_identity: str = ""
    sub_user_data: str = ""
    user_identifier: str = ""
    accounting_token: bytes = b""
    appl_identity_data: str = ""
    created: float = 0.0
    #: Seconds since the epoch after which the subscription lapses (0: never); from the
    #: registering command's MQMD Expiry (reference §5.7).
    expires_at: float = 0.0
    #: Set once deliveries to its queue failed ``suspend_after`` times in a row: its
    #: matches are skipped (not dead-lettered) until a RegSub registers it again.
    suspended: bool = False

    @property
    def key(self) -> SubKey:
        d = self.destination
        return (self.stream, int(self.scheme), self.topic, d.q_mgr, d.queue, d.sink, self.correl_id)


@dataclass(slots=True)
class Publisher:
    """A registered publisher (RegPub, or implicit registration by Publish)."""

    stream: str
    topic: str
    q_mgr: str
    queue: str
    correl_id: bytes = b""
    reg_opts: int = 0

    @property
    def key(self) -> PubKey:
        return (self.stream, self.topic, self.q_mgr, self.queue, self.correl_id)


@dataclass(slots=True)
class Publication:
    """A publication as the engine understands it, independent of its header format.

    ``topics`` are literal topics inside ``stream``. ``user_pairs`` are MQRFH name/value
    pairs that are not MQPS tags (passed through to MQRFH subscribers);
    ``extra_folders`` are the MQRFH2 folders other than ``psc`` (passed through to MQRFH2
    subscribers), kept as their XML text.
    """

    stream: str
    topics: list[str]
    payload: bytes
    payload_format: str = ""
    payload_encoding: int = 546
    payload_ccsid: int = 1208
    persistence: int = 0
    priority: int = 0
    expiry: int = -1
    pub_opts: int = 0
    pub_time: str = ""
    seq_num: str = ""
    int_data: list[str] = field(default_factory=list)
    string_data: list[str] = field(default_factory=list)
    user_pairs: list[tuple[str, str]] = field(default_factory=list)
    extra_folders: list[str] = field(default_factory=list)
    publisher_q_mgr: str = ""
    publisher_queue: str = ""
    direct_requests: bool = False
    #: Published with RegOpt Local: not forwarded to neighbour brokers.
    local: bool = False
    #: The gateway plugin instance (sink name) this publication came in through, from
    #: its ``mqgw`` folder; that sink never gets it back (no bridging loops).
    origin: str = ""
    #: The publishing message's MQMD PutDate (YYYYMMDD) and PutTime (HHMMSSTH, GMT):
    #: when the publication entered MQ (end-to-end latency, Kafka/MQTT put timestamp).
    put_date: str = ""
    put_time: str = ""
    #: The publishing message's MsgId, CorrelId (24 raw bytes each; empty when unknown)
    #: and UserIdentifier, and which header it used ("MQRFH" / "MQRFH2").
    msg_id: bytes = b""
    correl_id: bytes = b""
    user_identifier: str = ""
    header: str = ""


@dataclass(slots=True)
class RetainedPublication:
    """The retained publication of one topic of one stream (RetainPub).

    ``stored_at`` (seconds since the epoch) lets Expiry be reduced by the time the
    publication was held (reference §5.7).

    ``unsettled`` (0: settled) marks a copy stored from a neighbour's forward whose MQ
    unit of work may not have committed yet: the store commits first, so after a crash
    (or a failed MQ commit) between the two the forward comes again, and must not be
    taken for a replay of this copy (docs/neighbours.md). It is a token unique to the
    unit of work that stored it, so settling it never settles a newer copy.
    """

    stream: str
    topic: str
    publication: Publication
    stored_at: float = 0.0
    unsettled: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.topic)
