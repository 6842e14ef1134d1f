"""Formatting a publication for one subscriber (reference §5.7 "publications forwarded").

MQRFH subscribers get an MQRFH v1 ``MQPSCommand Publish`` with the topic *inside its
stream* (the ``$SYS/STREAM/<stream>/`` prefix removed, the seed's note) and
``MQPSStreamName`` for a named stream or when they asked InclStreamName; MQRFH2
subscribers get a ``psc`` folder with the full (prefixed) topic plus the publisher's
other folders; sinks get the bare payload. The MQMD is the broker's: DATAGRAM, new
MsgId, CorrelId = the subscriber's with CorrelAsId (else a stable non-zero value derived
from the subscription), persistence per Pers/NonPers/PersAsQueue/PersAsPub, the
subscriber's registration identity context, PutApplType MQAT_BROKER.

A neighbour broker's proxy subscription gets a *forwarded Publish command* instead
(docs/neighbours.md): the same header generation the neighbour's kind speaks, with this
broker's identity (``QMgrName`` = our queue manager, ``QName`` = the stream) and
``OtherSubsOnly``, so the neighbour never sends it back to us, ``NoReg`` in MQRFH (the
psc folder has no such option: a gateway registers no publisher whose queue manager is
a neighbour), plus ``RetainPub`` when
the publication is a retained one, so the neighbour keeps a copy, and the MsgId the
publication was first put with (how a neighbour recognises a retained publication it
already holds when it is replayed to a new proxy subscription).
"""

from __future__ import annotations

import functools
import hashlib
import re

from gateway.pubsub.options import PubOpt, RegOpt
from gateway.pubsub.records import Publication, SubFormat, SubKey, Subscription
from gateway.pubsub.streams import DEFAULT_STREAM, prefixed_topic
from gateway.wire.constants import ENC_NATIVE, MI_NONE, MsgType, PutApplType
from gateway.wire.folder import Element, parse_folder
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time
from gateway.wire.rfh import MQRFH, encode_rfh
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

#: CCSID the broker writes its MQRFH/MQRFH2 header text in.
HEADER_CCSID = 1208
_CORREL_PREFIX = b"MQGWPUB\x00"
#: MQRFH user pair names that can become MQRFH2 ``usr`` elements (reference §4.2).
_ELEMENT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
# Plain ints: IntFlag arithmetic is slow on the per-delivery path.
_PERS = int(RegOpt.PERSISTENT)
_NON_PERS = int(RegOpt.NON_PERSISTENT)
_PERS_AS_Q = int(RegOpt.PERSISTENT_AS_Q)
_INFORM = int(RegOpt.INFORM_IF_RETAINED)
_INCL_STREAM = int(RegOpt.INCLUDE_STREAM_NAME)
_CORREL_AS_ID = int(RegOpt.CORREL_ID_AS_IDENTITY)
_RETAIN = int(PubOpt.RETAIN_PUBLICATION)
# Enum members as module globals: a member lookup on the enum class costs ~0.5 us,
# several per delivery (the same members, so identity and type are unchanged).
_FMT_RFH = SubFormat.RFH
_FMT_RFH2 = SubFormat.RFH2
_DATAGRAM = MsgType.DATAGRAM
_BROKER = PutApplType.BROKER


def _usr_pairs(pub: Publication) -> list[tuple[str, str]]:
    """An MQRFH2 publication's flat ``usr`` properties as MQRFH user name/value pairs
    (what an MQRFH subscriber can see of them); names starting ``MQ`` are reserved."""
    out: list[tuple[str, str]] = []
    for text in pub.extra_folders:
        if text.startswith("<usr"):
            folder = parse_folder(text)
            if folder.name == "usr":
                out.extend(
                    (c.name, c.text)
                    for c in folder.children
                    if not c.children and not c.name.startswith("MQ")
                )
    return out


def escape_char_topic(topic: str) -> str:
    """A literal topic as an MQRFH publication writes it (``*``, ``?``, ``%`` escaped)."""
    if "%" not in topic and "*" not in topic and "?" not in topic:
        return topic
    return topic.replace("%", "%%").replace("*", "%*").replace("?", "%?")


def broker_correl_id(sub: Subscription) -> bytes:
    """Non-zero CorrelId for a subscriber without CorrelAsId: stable per subscription,
    so a re-delivery after a crash carries the same value."""
    return _correl_of_key(sub.key)


@functools.lru_cache(maxsize=65536)
def _correl_of_key(key: SubKey) -> bytes:
    return _CORREL_PREFIX + hashlib.blake2b(repr(key).encode(), digest_size=16).digest()


def delivery_persistence(sub: Subscription, pub: Publication) -> int:
    """Pers / NonPers / PersAsQueue override the publisher's persistence (PersAsPub)."""
    opts = sub.reg_opts
    if opts & _PERS:
        return 1  # MQPER_PERSISTENT
    if opts & _NON_PERS:
        return 0  # MQPER_NOT_PERSISTENT
    if opts & _PERS_AS_Q:
        return 2  # MQPER_PERSISTENCE_AS_Q_DEF
    return pub.persistence


def _rfh_body(
    pub: Publication,
    topic: str,
    informed_retained: bool,
    include_stream: bool,
    forwarder: str = "",
    retain: bool = False,
) -> bytes:
    """``forwarder``: this broker's queue manager when the body is a Publish forwarded
    to a neighbour (identity forwarder/stream, OtherSubsOnly, RetainPub if ``retain``)."""
    pairs: list[tuple[str, str]] = [("MQPSCommand", "Publish")]
    if informed_retained:
        pairs.append(("MQPSPubOpts", "IsRetainedPub"))
    if include_stream:
        pairs.append(("MQPSStreamName", pub.stream))
    pairs.append(("MQPSTopic", escape_char_topic(topic)))
    if forwarder:
        pairs.append(("MQPSQMgrName", forwarder))
        pairs.append(("MQPSQName", pub.stream))
        pairs.append(("MQPSPubOpts", "OtherSubsOnly"))
        pairs.append(("MQPSPubOpts", "NoReg"))  # no publisher row per topic at the receiver
        if retain:
            pairs.append(("MQPSPubOpts", "RetainPub"))
    elif pub.direct_requests and pub.publisher_queue:
        pairs.append(("MQPSQMgrName", pub.publisher_q_mgr))
        pairs.append(("MQPSQName", pub.publisher_queue))
    if pub.pub_time:
        pairs.append(("MQPSPubTime", pub.pub_time))
    if pub.seq_num:
        pairs.append(("MQPSSeqNum", pub.seq_num))
    pairs.extend(("MQPSIntData", v) for v in pub.int_data)
    pairs.extend(("MQPSStringData", v) for v in pub.string_data)
    pairs.extend(pub.user_pairs)
    pairs.extend(_usr_pairs(pub))
    rfh = MQRFH(
        name_values=pairs,
        encoding=pub.payload_encoding,
        coded_char_set_id=pub.payload_ccsid,
        format=pub.payload_format,
    )
    return encode_rfh(rfh, ENC_NATIVE, ccsid=HEADER_CCSID) + pub.payload


def _rfh2_body(
    pub: Publication, topic: str, informed_retained: bool, forwarder: str = "", retain: bool = False
) -> bytes:
    """``forwarder``/``retain`` as for :func:`_rfh_body`."""
    psc = Element("psc")
    psc.add("Command", "Publish")
    psc.add("Topic", prefixed_topic(pub.stream, topic))
    if informed_retained:
        psc.add("PubOpt", "IsRetainedPub")
    if forwarder:
        psc.add("QMgrName", forwarder)
        psc.add("QName", pub.stream)
        psc.add("PubOpt", "OtherSubsOnly")
        if retain:
            psc.add("PubOpt", "RetainPub")
    elif pub.direct_requests and pub.publisher_queue:
        psc.add("QMgrName", pub.publisher_q_mgr)
        psc.add("QName", pub.publisher_queue)
    if pub.pub_time:
        psc.add("PubTime", pub.pub_time)
    if pub.seq_num:
        psc.add("SeqNum", pub.seq_num)
    folders = [psc] + [parse_folder(text) for text in pub.extra_folders]
    if pub.user_pairs and not any(f.name == "usr" for f in folders):
        usr = [(n, v) for n, v in pub.user_pairs if _ELEMENT_NAME.fullmatch(n)]
        if usr:
            folders.append(Element.from_pairs("usr", usr))
    rfh2 = MQRFH2(
        folders=folders,
        encoding=pub.payload_encoding,
        coded_char_set_id=pub.payload_ccsid,
        format=pub.payload_format,
    )
    return encode_rfh2(rfh2, ENC_NATIVE, ccsid=HEADER_CCSID) + pub.payload


def build_delivery(
    pub: Publication,
    sub: Subscription,
    topic: str,
    *,
    retained: bool,
    broker_q_mgr: str,
    now: float,
    held_for: float = 0.0,
    body_cache: dict[tuple[object, ...], bytes] | None = None,
    stamp: tuple[str, str] | None = None,
    forward_as: SubFormat | None = None,
) -> tuple[MQMD, bytes]:
    """The MQMD and body of ``pub`` (matched on ``topic``, inside its stream) for ``sub``.

    ``body_cache`` lets one publication's many deliveries share the encoded header:
    the body depends only on the subscriber format and a few flags, not on the
    subscriber itself. ``forward_as`` (RFH or RFH2): ``sub`` is a neighbour broker's
    proxy subscription, so the delivery is a forwarded Publish command in that header.
    """
    opts = sub.reg_opts
    informed = retained and bool(opts & _INFORM)
    if forward_as is not None:
        retain = retained or bool(pub.pub_opts & _RETAIN)
        rfh2 = forward_as is _FMT_RFH2
        ck: tuple[object, ...] = (5 if rfh2 else 4, topic, retain)
        body = body_cache.get(ck) if body_cache is not None else None
        if body is None:
            body = (
                _rfh2_body(pub, topic, False, broker_q_mgr, retain)
                if rfh2
                else _rfh_body(pub, topic, False, True, broker_q_mgr, retain)
            )
        fmt = FMT_RF_HEADER_2 if rfh2 else FMT_RF_HEADER
        encoding, ccsid = ENC_NATIVE, HEADER_CCSID
    elif sub.fmt is _FMT_RFH:
        include_stream = pub.stream != DEFAULT_STREAM or bool(opts & _INCL_STREAM)
        ck = (1, topic, informed, include_stream)
        body = body_cache.get(ck) if body_cache is not None else None
        if body is None:
            body = _rfh_body(pub, topic, informed, include_stream)
        fmt, encoding, ccsid = FMT_RF_HEADER, ENC_NATIVE, HEADER_CCSID
    elif sub.fmt is _FMT_RFH2:
        ck = (2, topic, informed)
        body = body_cache.get(ck) if body_cache is not None else None
        if body is None:
            body = _rfh2_body(pub, topic, informed)
        fmt, encoding, ccsid = FMT_RF_HEADER_2, ENC_NATIVE, HEADER_CCSID
    else:
        ck = (3,)
        body = pub.payload
        fmt, encoding, ccsid = pub.payload_format, pub.payload_encoding, pub.payload_ccsid
    if body_cache is not None:
        body_cache[ck] = body
    expiry = pub.expiry
    if retained and expiry > 0:
        expiry = max(1, expiry - int(held_for * 10))
    put_date, put_time = stamp if stamp is not None else put_date_time(now)
    correl_as_id = opts & _CORREL_AS_ID and sub.correl_id
    md = MQMD(
        report=0,
        msg_type=_DATAGRAM,
        expiry=expiry,
        encoding=encoding,
        coded_char_set_id=ccsid,
        format=fmt,
        priority=pub.priority,
        persistence=delivery_persistence(sub, pub),
        msg_id=MI_NONE,
        correl_id=sub.correl_id if correl_as_id else broker_correl_id(sub),
        reply_to_q="",
        reply_to_q_mgr=broker_q_mgr,
        user_identifier=sub.user_identifier,
        accounting_token=sub.accounting_token.ljust(32, b"\x00")[:32],
        appl_identity_data=sub.appl_identity_data,
        put_appl_type=_BROKER,
        put_appl_name=broker_q_mgr[:28],
        put_date=put_date,
        put_time=put_time,
        appl_origin_data="",
    )
    if forward_as is not None and pub.msg_id and pub.msg_id != MI_NONE:
        # The publication keeps its first MsgId across the network: a neighbour tells a
        # retained publication replayed to a new proxy from a new one by it.
        md.msg_id = pub.msg_id
    return md, body
