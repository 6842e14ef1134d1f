"""Broker administration publications: what brokers tell their neighbours about themselves.

Why: in a WebSphere MQ Publish/Subscribe network every broker publishes, as retained
publications on ``SYSTEM.BROKER.ADMIN.STREAM``, which streams it supports
(``MQ/<QMgrName>/StreamSupport``), its parent and children (``.../Parent``,
``.../Children``) and events (``.../Event/StreamDeleted``, ``.../Event/BrokerDeleted``,
``.../Event/SubscriptionDeregistered``). A joining broker subscribes to its neighbour's
StreamSupport topic to learn the common streams; the gateway reads and publishes these
so a real broker can stand on the other side. ``<QMgrName>`` is always 48 characters,
blank padded (:func:`metatopic`).

Format (public V6 documentation, "Format of broker administration messages" and
"Writing system management applications", amqnar mqps014 / amq622s; "Message format for
metatopics", mqps027): a Publish message in PCF, MQMD.Format ``MQADMIN``, MQCFH
Type MQCFT_COMMAND (1), Command MQCMD_PUBLISH (63), then always:

* PublicationOptions (MQCFIN, MQIACF_PUBLICATION_OPTIONS 1082): MQPUBO_RETAIN_PUBLICATION
  (2) set when retained.
* StreamName (MQCFST, MQCACF_STREAM_NAME 3030) = ``SYSTEM.BROKER.ADMIN.STREAM``.
* Topic (MQCFST, MQCACF_TOPIC 3031) = the metatopic.
* PublishTimestamp (MQCFST, MQCACF_PUBLISH_TIMESTAMP 3034): 16 characters
  ``YYYYMMDDHHMMSSTH``, universal time (parameter page amqnar10103).

and then one MQCFST per name, with these parameter identifiers:

* Parent: MQCACF_PARENT_Q_MGR_NAME (3032), exactly once — documented ("Parent messages",
  amqnar1093).
* StreamSupport: MQCACF_SUPPORTED_STREAM_NAME (3036), once per stream. The IBM page for
  this message was not found in the public material searched; the identifier and its
  repetition as MQCFST are those the MQSeries Perl module (MQSeries::PubSub::
  AdminMessage) reports observing in real brokers' StreamSupport publications.
* Children: MQCACF_CHILD_Q_MGR_NAME (3040), once per child — **assumption**: the cmqcfc.h
  constant named for it; page not found.
* StreamDeleted: MQCACF_REG_STREAM_NAME (3041), once per deleted stream — **assumption**
  (StreamName itself is taken by the admin stream; closest documented constant).
* BrokerDeleted: MQCA_Q_MGR_NAME (2015), once per deleted broker — **assumption** (the
  identifier IBM's event messages use for a queue manager name).
* SubscriptionDeregistered: MQCACF_REG_TOPIC (3037), once per topic of the removed
  subscription — **assumption**, and partial: the documentation says the event carries
  the metatopic registration group (RegistrationQMgrName, ...); only the topics are kept.

Decoding is lenient where a real broker may differ: names may come as MQCFST repeated or
as one MQCFSL, trailing blanks are stripped, unknown extra parameters are ignored
(IBM warns the format may change), MQPUBO_IS_RETAINED_PUBLICATION also counts as
retained, and MQRFH/MQRFH2 headers before the PCF (a broker delivering the publication to
an RFH subscriber) are skipped. Anything else that is not such a publication raises
WireError.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from gateway.pubsub.streams import ADMIN_STREAM, INTER_BROKER_QUEUE
from gateway.wire.ccsid import DEFAULT_STRUCTURE_CCSID
from gateway.wire.chain import parse_message
from gateway.wire.constants import ENC_NATIVE, Q_MGR_NAME_LENGTH, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_ADMIN, FMT_PCF, FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.pcf import (
    MQCA_Q_MGR_NAME,
    MQCACF_CHILD_Q_MGR_NAME,
    MQCACF_PARENT_Q_MGR_NAME,
    MQCACF_PUBLISH_TIMESTAMP,
    MQCACF_REG_STREAM_NAME,
    MQCACF_REG_TOPIC,
    MQCACF_STREAM_NAME,
    MQCACF_SUPPORTED_STREAM_NAME,
    MQCACF_TOPIC,
    MQCFT_COMMAND,
    MQCMD_PUBLISH,
    MQIACF_PUBLICATION_OPTIONS,
    IntParam,
    PCFHeader,
    PCFParam,
    StringListParam,
    StringParam,
    decode_pcf,
    encode_pcf,
)
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason

__all__ = [
    "ADMIN_STREAM",
    "INTER_BROKER_QUEUE",
    "LEAVES",
    "NAME_PARAMETERS",
    "AdminKind",
    "AdminPublication",
    "admin_topic",
    "decode_admin_publication",
    "encode_admin_publication",
    "metatopic",
    "parse_admin_topic",
    "publish_timestamp",
]

AdminKind = Literal[
    "StreamSupport",
    "Parent",
    "Children",
    "StreamDeleted",
    "BrokerDeleted",
    "SubscriptionDeregistered",
]
#: The metatopic leaf of each kind (what follows ``MQ/<QMgrName>/``).
LEAVES: dict[AdminKind, str] = {
    "StreamSupport": "StreamSupport",
    "Parent": "Parent",
    "Children": "Children",
    "StreamDeleted": "Event/StreamDeleted",
    "BrokerDeleted": "Event/BrokerDeleted",
    "SubscriptionDeregistered": "Event/SubscriptionDeregistered",
}
#: The parameter identifier each kind's names are carried in (see the module docstring).
NAME_PARAMETERS: dict[AdminKind, int] = {
    "StreamSupport": MQCACF_SUPPORTED_STREAM_NAME,
    "Parent": MQCACF_PARENT_Q_MGR_NAME,
    "Children": MQCACF_CHILD_Q_MGR_NAME,
    "StreamDeleted": MQCACF_REG_STREAM_NAME,
    "BrokerDeleted": MQCA_Q_MGR_NAME,
    "SubscriptionDeregistered": MQCACF_REG_TOPIC,
}
assert set(LEAVES) == set(NAME_PARAMETERS) == set(get_args(AdminKind))

PUBO_RETAIN_PUBLICATION = 2
PUBO_IS_RETAINED_PUBLICATION = 16
METATOPIC_PREFIX = "MQ/"
_FIXED = (MQIACF_PUBLICATION_OPTIONS, MQCACF_STREAM_NAME, MQCACF_TOPIC, MQCACF_PUBLISH_TIMESTAMP)


def metatopic(q_mgr: str, leaf: str) -> str:
    """``MQ/<q_mgr blank padded to 48>/<leaf>``, the documented metatopic spelling."""
    if not q_mgr or len(q_mgr) > Q_MGR_NAME_LENGTH or q_mgr != q_mgr.rstrip(" "):
        raise ValueError(f"queue manager name {q_mgr!r} is not 1-48 characters")
    return f"{METATOPIC_PREFIX}{q_mgr.ljust(Q_MGR_NAME_LENGTH)}/{leaf}"


def admin_topic(kind: AdminKind, q_mgr: str) -> str:
    """The metatopic ``q_mgr``'s broker publishes ``kind`` on."""
    return metatopic(q_mgr, LEAVES[kind])


def parse_admin_topic(topic: str) -> tuple[AdminKind, str]:
    """(kind, queue manager name) of an administration metatopic; WireError otherwise.

    The queue manager name is read up to the leaf and stripped of its padding, so an
    unpadded name (a broker not following the 48-character rule) is still understood.
    """
    if topic.startswith(METATOPIC_PREFIX):
        for kind, leaf in LEAVES.items():
            suffix = "/" + leaf
            if topic.endswith(suffix):
                q_mgr = topic[len(METATOPIC_PREFIX) : -len(suffix)].rstrip(" ")
                if q_mgr and len(q_mgr) <= Q_MGR_NAME_LENGTH:
                    return kind, q_mgr
    raise WireError(Reason.TOPIC_ERROR, f"{topic!r} is not a broker administration metatopic")


def publish_timestamp(now: float | datetime | None = None) -> str:
    """PublishTimestamp ``YYYYMMDDHHMMSSTH`` (universal time) of ``now`` (None = now)."""
    date, time = put_date_time(now)
    return date + time


@dataclass(frozen=True, slots=True)
class AdminPublication:
    """One broker administration publication. ``q_mgr`` is the publishing broker's queue
    manager; ``names`` are the streams (StreamSupport, StreamDeleted), queue managers
    (Parent, Children, BrokerDeleted) or topics (SubscriptionDeregistered)."""

    kind: AdminKind
    q_mgr: str
    names: tuple[str, ...]
    retained: bool
    timestamp: str

    @property
    def topic(self) -> str:
        """The metatopic it is published on."""
        return admin_topic(self.kind, self.q_mgr)


def encode_admin_publication(
    pub: AdminPublication,
    *,
    encoding: int = ENC_NATIVE,
    ccsid: int = DEFAULT_STRUCTURE_CCSID,
) -> tuple[MQMD, bytes]:
    """The publication as a subscriber receives it: an MQMD (Format MQADMIN, datagram,
    persistent, ``encoding``/``ccsid``) and the PCF body. A Parent publication names
    exactly one queue manager (ValueError otherwise)."""
    if pub.kind == "Parent" and len(pub.names) != 1:
        raise ValueError(f"a Parent publication names one queue manager, not {pub.names!r}")
    options = PUBO_RETAIN_PUBLICATION if pub.retained else 0
    params: list[PCFParam] = [
        IntParam(MQIACF_PUBLICATION_OPTIONS, options),
        StringParam(MQCACF_STREAM_NAME, ADMIN_STREAM),
        StringParam(MQCACF_TOPIC, pub.topic),
        StringParam(MQCACF_PUBLISH_TIMESTAMP, pub.timestamp),
    ]
    name_parameter = NAME_PARAMETERS[pub.kind]
    params.extend(StringParam(name_parameter, name) for name in pub.names)
    body = encode_pcf(
        PCFHeader(type=MQCFT_COMMAND, command=MQCMD_PUBLISH), params, encoding, ccsid=ccsid
    )
    md = MQMD(
        format=FMT_ADMIN,
        msg_type=MsgType.DATAGRAM,
        persistence=Persistence.PERSISTENT,
        encoding=encoding,
        coded_char_set_id=ccsid,
    )
    return md, body


def decode_admin_publication(md: MQMD, body: bytes | bytearray | memoryview) -> AdminPublication:
    """Read a broker administration publication; WireError when it is not one.

    The PCF is the message data (Format MQADMIN, or MQPCF) or follows MQRFH / MQRFH2
    headers (a broker that delivers the publication to an RFH subscriber prefixes one).
    """
    fmt, encoding, ccsid = md.format, md.encoding, md.coded_char_set_id
    if fmt in (FMT_RF_HEADER, FMT_RF_HEADER_2):
        parsed = parse_message(md, body)
        body, fmt, encoding, ccsid = parsed.payload, parsed.format, parsed.encoding, parsed.ccsid
    if fmt not in (FMT_ADMIN, FMT_PCF):
        raise WireError(Reason.FORMAT_ERROR, f"Format is {fmt!r}, expected {FMT_ADMIN!r}")
    header, params = decode_pcf(body, encoding, ccsid=ccsid)
    if header.type != MQCFT_COMMAND or header.command != MQCMD_PUBLISH:
        raise WireError(
            Reason.CFH_TYPE_ERROR,
            f"MQCFH Type {header.type} Command {header.command} is not a Publish "
            f"({MQCFT_COMMAND}/{MQCMD_PUBLISH})",
            0,
        )
    for parameter in _FIXED:
        if sum(p.parameter == parameter for p in params) != 1:
            raise WireError(Reason.FORMAT_ERROR, f"parameter {parameter} must occur exactly once")
    by_id = {p.parameter: p for p in params if p.parameter in _FIXED}
    options = by_id[MQIACF_PUBLICATION_OPTIONS]
    stream, topic, stamp = (by_id[p] for p in _FIXED[1:])
    if not isinstance(options, IntParam):
        raise WireError(Reason.FORMAT_ERROR, "PublicationOptions is not an MQCFIN")
    if not (
        isinstance(stream, StringParam)
        and isinstance(topic, StringParam)
        and isinstance(stamp, StringParam)
    ):
        raise WireError(Reason.FORMAT_ERROR, "StreamName, Topic or PublishTimestamp is not MQCFST")
    if stream.value.rstrip(" ") != ADMIN_STREAM:
        raise WireError(
            Reason.INCORRECT_STREAM, f"StreamName {stream.value!r} is not {ADMIN_STREAM!r}"
        )
    kind, q_mgr = parse_admin_topic(topic.value)
    name_parameter = NAME_PARAMETERS[kind]
    names: list[str] = []
    for p in params:
        if p.parameter != name_parameter:
            continue
        if isinstance(p, StringParam):
            names.append(p.value.rstrip(" "))
        elif isinstance(p, StringListParam):
            names.extend(p.values)
        else:
            raise WireError(Reason.FORMAT_ERROR, f"parameter {name_parameter} is not text")
    if kind == "Parent" and len(names) != 1:
        raise WireError(
            Reason.FORMAT_ERROR, f"a Parent publication names {len(names)} queue managers"
        )
    return AdminPublication(
        kind=kind,
        q_mgr=q_mgr,
        names=tuple(names),
        retained=bool(options.value & (PUBO_RETAIN_PUBLICATION | PUBO_IS_RETAINED_PUBLICATION)),
        timestamp=stamp.value.rstrip(" "),
    )
