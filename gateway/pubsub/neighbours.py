"""Neighbours: other brokers this broker exchanges publications with, and the documented
command messages it sends them (sans-I/O; docs/neighbours.md).

Why its own module: everything the broker says to a neighbour is a queued pub/sub
command a real broker understands (reference §5.2-§5.5), so what a neighbour *is*
(queue manager, kind, role, common streams) and how each command to it is built live
together, apart from the engine that decides *when*. The runtime's neighbour links
(gateway.runtime.neighbours) diff :func:`wanted_proxies` against what they registered
and put the commands these functions build; the engine formats publications for a
neighbour's proxy subscription as forwarded Publish commands
(:func:`gateway.pubsub.deliveries.build_forwarded_publish`).

Kinds and their stream rule: ``mqpubsub`` (a WebSphere MQ Publish/Subscribe broker)
and ``mqv7`` (a V7+ queue manager with queued pub/sub) get MQRFH commands naming the
stream with ``MQPSStreamName`` and character-scheme topics; ``gateway`` gets MQRFH2
commands whose topic carries ``$SYS/STREAM/<stream>/``. A subscription pattern that the
neighbour's scheme cannot express exactly is sent as the narrowest pattern it can
express that matches *at least* the same topics (:func:`char_pattern_of`,
:func:`topic_pattern_of`): the receiving broker matches each forwarded publication
against its own subscriptions again, so a wider proxy costs traffic, never a wrong
delivery, while a narrower one would lose publications.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gateway.pubsub.deliveries import escape_char_topic
from gateway.pubsub.options import RegOpt
from gateway.pubsub.outcome import OutboundMessage
from gateway.pubsub.records import Subscription
from gateway.pubsub.streams import (
    ADMIN_STREAM,
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
    prefixed_topic,
    split_topic,
)
from gateway.pubsub.topics import Scheme, uses_topic_wildcards
from gateway.wire.constants import ENC_NATIVE, MsgType, Persistence, PutApplType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH, encode_rfh
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

__all__ = [
    "MAX_TOPICS_PER_COMMAND",
    "MAX_TOPIC_BYTES_PER_COMMAND",
    "METATOPIC_PREFIX",
    "PROBE_PREFIX",
    "Neighbour",
    "NeighbourKind",
    "NeighbourRole",
    "ProxyKey",
    "admin_subscription",
    "char_pattern_of",
    "delete_forwards",
    "delete_publication",
    "local_topic",
    "neighbour_topic",
    "probe_publication",
    "proxy_batch_command",
    "proxy_batches",
    "proxy_command",
    "topic_pattern_of",
    "uses_rfh2",
    "wanted_proxies",
]

#: Topic prefixes of administrative subscriptions that never propagate to neighbours:
#: the broker administration metatopics and the gateway's loop probes (the one home of
#: both: the runtime's neighbour links build and recognise probe topics with it).
METATOPIC_PREFIX = "MQ/"
PROBE_PREFIX = "MQGW/Probe/"
_LOCAL = int(RegOpt.LOCAL)
#: A proxy RegSub/DeregSub carries at most this many topics and this many bytes of
#: topic text: a burst of new topics crosses a link as few commands (one unit of work,
#: one response each at the neighbour), each well under any queue's MAXMSGL.
MAX_TOPICS_PER_COMMAND = 100
MAX_TOPIC_BYTES_PER_COMMAND = 32 * 1024
#: CCSID the command headers' own text is written in.
_HEADER_CCSID = 1208


class NeighbourKind(enum.StrEnum):
    """What runs on the neighbour's queue manager (decides header and stream rule)."""

    MQPUBSUB = "mqpubsub"
    MQV7 = "mqv7"
    GATEWAY = "gateway"


class NeighbourRole(enum.StrEnum):
    """The neighbour's place in the hierarchy, seen from this broker."""

    PARENT = "parent"
    CHILD = "child"


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A broker on another queue manager that this broker exchanges publications with.

    ``streams`` are the streams both support (always holding the default stream):
    proxies, forwarded publications and DeletePubs only travel on them.
    ``publish_all``: every publication on a shared stream is forwarded to it, whether or
    not it registered a subscription here — for a real legacy broker, which propagates
    its subscriptions only with its own inter-broker protocol (its own matching then
    serves its subscribers).
    """

    q_mgr: str
    kind: NeighbourKind
    role: NeighbourRole
    streams: frozenset[str]
    publish_all: bool = False


@dataclass(frozen=True, slots=True, order=True)
class ProxyKey:
    """One proxy subscription at a neighbour: ``topic`` is the pattern within
    ``stream`` in the neighbour's own ``scheme`` (CHAR for MQRFH kinds, TOPIC for
    gateways)."""

    stream: str
    topic: str
    scheme: int


def uses_rfh2(kind: NeighbourKind) -> bool:
    """Commands to gateways are MQRFH2; to legacy brokers and V7 queue managers MQRFH."""
    return kind is NeighbourKind.GATEWAY


# ------------------------------------------------------------------ topic mapping ----


def neighbour_topic(kind: NeighbourKind, stream: str, topic: str) -> str:
    """What ``topic`` of ``stream`` is called in the neighbour's native topic space:
    ``$SYS/STREAM/S/T`` (gateway, message-broker style), ``S/T`` (an MQ V7+ queue
    manager, whose topic object for stream S has topic string S), ``T`` on the default
    stream for every kind."""
    if stream == DEFAULT_STREAM:
        return topic
    if kind is NeighbourKind.MQV7:
        return f"{stream}/{topic}"
    return prefixed_topic(stream, topic)


def local_topic(
    kind: NeighbourKind, topic: str, *, streams: Collection[str] = ()
) -> tuple[str, str]:
    """The inverse of :func:`neighbour_topic`: (stream, topic within it).

    An MQ V7+ topic string ``S/T`` only names stream S when S is one of ``streams``
    (the common streams): anything else is a topic of the default stream.
    """
    if kind is NeighbourKind.MQV7:
        head, slash, rest = topic.partition("/")
        if slash and head in streams and head != DEFAULT_STREAM:
            return head, rest
        return DEFAULT_STREAM, topic
    st = split_topic(topic)
    return st.stream, st.topic


def char_pattern_of(pattern: str) -> str:
    """A character-scheme pattern matching at least the topics ``pattern`` (topic
    scheme) matches: ``+`` becomes ``*``; ``#`` with one adjacent ``/`` becomes ``*``
    (``a/#`` -> ``a*``, ``#/b`` -> ``*b``, ``a/#/b`` -> ``a*/b``; a run ``#/#`` is one
    ``#``); literal ``*?%`` are
    escaped. Exact for patterns without wildcards."""
    levels: list[str] = []
    for level in pattern.split("/"):
        if not (level == "#" and levels and levels[-1] == "#"):
            levels.append(level)  # '#/#' matches what '#' matches: one '*' for the run
    out = ""
    for i, level in enumerate(levels):
        if level == "#":
            out += "*"  # takes the place of the separator before it
            continue
        if i > 0 and not (i == 1 and levels[0] == "#"):  # '#/' at the start: absorbed
            out += "/"
        out += "*" if level == "+" else escape_char_topic(level)
    return out


def topic_pattern_of(pattern: str) -> str:
    """A topic-scheme pattern matching at least the topics ``pattern`` (character
    scheme) matches: the literal levels before the first level holding a wildcard
    (``*``, ``?``, or a level that would be a topic wildcard) and then ``#``. Exact for
    patterns without wildcards."""
    levels: list[str] = []
    current: list[str] = []
    wild = False
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            current.append(pattern[i + 1])
            i += 2
            continue
        if ch in "*?":
            wild = True
            break
        if ch == "/":
            levels.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if not wild:
        levels.append("".join(current))
    for n, level in enumerate(levels):
        if level in ("#", "+"):
            return "/".join([*levels[:n], "#"])
    if wild:
        return "/".join([*levels, "#"])
    return "/".join(levels)


def _proxy_pattern(sub: Subscription, rfh2: bool) -> tuple[str, int]:
    if rfh2:
        if sub.scheme == Scheme.TOPIC:
            return sub.topic, int(Scheme.TOPIC)
        return topic_pattern_of(sub.topic), int(Scheme.TOPIC)
    if sub.scheme == Scheme.CHAR:
        return sub.topic, int(Scheme.CHAR)
    return char_pattern_of(sub.topic), int(Scheme.CHAR)


# ------------------------------------------------------------------ proxies ----------


def wanted_proxies(
    subs: Iterable[Subscription], neighbour: Neighbour, neighbours: Collection[str]
) -> Counter[ProxyKey]:
    """How many local subscribers need each proxy subscription at ``neighbour``.

    Counted: every subscription (MQ applications, sinks, and other neighbours' proxy
    subscriptions, so interest crosses several hops) whose destination is not the
    neighbour itself, on a stream the neighbour shares, not suspended, not on the admin
    stream, not on a metatopic (``MQ/``) or a probe topic (``MQGW/Probe/``), not
    registered with RegOpt Local (documented as "not distributed to other brokers").
    ``neighbours`` are the queue managers of every known neighbour: their
    administrative subscriptions (to the inter-broker queue) never count, whatever
    their stream. Patterns are in the neighbour's scheme (module docstring).
    """
    rfh2 = uses_rfh2(neighbour.kind)
    streams = neighbour.streams
    own = neighbour.q_mgr
    out: Counter[ProxyKey] = Counter()
    for sub in subs:
        d = sub.destination
        if d.q_mgr == own and not d.sink:
            continue
        if sub.suspended or sub.stream == ADMIN_STREAM or sub.stream not in streams:
            continue
        if sub.reg_opts & _LOCAL:  # RegOpt Local: not distributed to other brokers
            continue
        if sub.topic.startswith(METATOPIC_PREFIX) or sub.topic.startswith(PROBE_PREFIX):
            continue
        if not d.sink and d.q_mgr in neighbours and d.queue.strip() == INTER_BROKER_QUEUE:
            continue
        topic, scheme = _proxy_pattern(sub, rfh2)
        out[ProxyKey(sub.stream, topic, scheme)] += 1
    return out


def _command_md(rfh2: bool, msg_type: int, self_q_mgr: str, msg_id: bytes) -> MQMD:
    return MQMD(
        msg_type=msg_type,
        format=FMT_RF_HEADER_2 if rfh2 else FMT_RF_HEADER,
        encoding=ENC_NATIVE,
        coded_char_set_id=_HEADER_CCSID,
        persistence=Persistence.PERSISTENT,
        msg_id=msg_id.ljust(24, b"\x00")[:24] if msg_id else bytes(24),
        reply_to_q=INTER_BROKER_QUEUE if msg_type == MsgType.REQUEST else "",
        reply_to_q_mgr=self_q_mgr,
        put_appl_type=PutApplType.BROKER,
        put_appl_name=self_q_mgr[:28],
    )


def _rfh_body(pairs: list[tuple[str, str]]) -> bytes:
    return encode_rfh(MQRFH(name_values=pairs), ENC_NATIVE, ccsid=_HEADER_CCSID)


def _rfh2_body(psc: Element) -> bytes:
    return encode_rfh2(MQRFH2(folders=[psc]), ENC_NATIVE, ccsid=_HEADER_CCSID)


def _subscription_command(
    kind: NeighbourKind,
    stream: str,
    topics: Sequence[str],
    *,
    register: bool,
    q_name: str,
    self_q_mgr: str,
    msg_id: bytes,
    to_q_mgr: str,
) -> OutboundMessage:
    """RegSub/DeregSub of ``topics`` (patterns in the neighbour's scheme, within
    ``stream``; the Topic parameter repeats, reference §5.4/§5.5) for the identity
    (self_q_mgr, q_name), to the neighbour's control queue."""
    command = "RegSub" if register else "DeregSub"
    rfh2 = uses_rfh2(kind)
    md = _command_md(rfh2, MsgType.REQUEST, self_q_mgr, msg_id)
    if rfh2:
        psc = Element("psc")
        psc.add("Command", command)
        if register:
            psc.add("RegOpt", "PersAsPub")
        for topic in topics:
            psc.add("Topic", neighbour_topic(kind, stream, topic))
        psc.add("QMgrName", self_q_mgr)
        psc.add("QName", q_name)
        body = _rfh2_body(psc)
    else:
        pairs = [("MQPSCommand", command)]
        if register:
            pairs.append(("MQPSRegOpts", "PersAsPub"))
            if q_name != INTER_BROKER_QUEUE:
                # a broker that is not a gateway flags its retained publications only
                # when asked: the gateway keeps them retained too (docs/neighbours.md)
                pairs.append(("MQPSRegOpts", "InformIfRet"))
        pairs += [
            ("MQPSStreamName", stream),
            *(("MQPSTopic", topic) for topic in topics),
            ("MQPSQMgrName", self_q_mgr),
            ("MQPSQName", q_name),
        ]
        body = _rfh_body(pairs)
    return OutboundMessage(to_q_mgr, CONTROL_QUEUE, md, body)


def proxy_batches(
    keys: Iterable[ProxyKey],
    *,
    max_topics: int = MAX_TOPICS_PER_COMMAND,
    max_topic_bytes: int = MAX_TOPIC_BYTES_PER_COMMAND,
) -> list[list[ProxyKey]]:
    """``keys`` split into the batches one proxy command each carries: one stream and
    scheme per batch, at most ``max_topics`` topics and ``max_topic_bytes`` bytes of
    topic text (a batch holds at least one key whatever its length); the order of
    ``keys`` is kept within each (stream, scheme)."""
    open_: dict[tuple[str, int], tuple[list[ProxyKey], int]] = {}
    batches: list[list[ProxyKey]] = []
    for key in keys:
        size = len(key.topic.encode("utf-8", "surrogatepass"))
        group = (key.stream, key.scheme)
        current = open_.get(group)
        if current is not None and (
            len(current[0]) >= max_topics or current[1] + size > max_topic_bytes
        ):
            current = None
        if current is None:
            batch: list[ProxyKey] = []
            batches.append(batch)
            current = (batch, 0)
        current[0].append(key)
        open_[group] = (current[0], current[1] + size)
    return batches


def proxy_command(
    neighbour: Neighbour, key: ProxyKey, *, register: bool, self_q_mgr: str, msg_id: bytes
) -> OutboundMessage:
    """The RegSub (``register``) or DeregSub of one proxy subscription at ``neighbour``.

    Identity ``QMgrName self_q_mgr``, ``QName key.stream`` (the neighbour's forwarded
    publications land on our stream queue), no CorrelId; RegOpts PersAsPub (+
    InformIfRet in MQRFH, so the neighbour flags its retained publications
    IsRetainedPub and this broker keeps them retained) and nothing that hides retained
    publications (a new proxy receives the neighbour's retained ones). REQUEST with
    ReplyToQ the inter-broker queue; responses correlate on ``msg_id``.
    """
    return proxy_batch_command(
        neighbour, [key], register=register, self_q_mgr=self_q_mgr, msg_id=msg_id
    )


def proxy_batch_command(
    neighbour: Neighbour,
    keys: Sequence[ProxyKey],
    *,
    register: bool,
    self_q_mgr: str,
    msg_id: bytes,
) -> OutboundMessage:
    """One RegSub (``register``) or DeregSub of several proxy subscriptions at
    ``neighbour``, all of one stream and scheme (a batch of :func:`proxy_batches`): the
    documented command with its Topic parameter repeated, one unit of work and one
    response at the neighbour instead of one per topic. Otherwise as
    :func:`proxy_command`."""
    if not keys:
        raise ValueError("a proxy command names at least one topic")
    stream, scheme = keys[0].stream, keys[0].scheme
    if any(k.stream != stream or k.scheme != scheme for k in keys):
        raise ValueError("one proxy command covers one stream and one scheme")
    return _subscription_command(
        neighbour.kind,
        stream,
        [k.topic for k in keys],
        register=register,
        q_name=stream,
        self_q_mgr=self_q_mgr,
        msg_id=msg_id,
        to_q_mgr=neighbour.q_mgr,
    )


def admin_subscription(
    neighbour: Neighbour, topic: str, *, register: bool, self_q_mgr: str, msg_id: bytes
) -> OutboundMessage:
    """RegSub/DeregSub of the literal ``topic`` on the admin stream (the StreamSupport
    metatopic, a loop probe), delivered to our inter-broker queue."""
    pattern = topic if uses_rfh2(neighbour.kind) else escape_char_topic(topic)
    return _subscription_command(
        neighbour.kind,
        ADMIN_STREAM,
        [pattern],
        register=register,
        q_name=INTER_BROKER_QUEUE,
        self_q_mgr=self_q_mgr,
        msg_id=msg_id,
        to_q_mgr=neighbour.q_mgr,
    )


def probe_publication(to_q_mgr: str, topic: str, *, self_q_mgr: str) -> OutboundMessage:
    """An anonymous MQRFH Publish of the literal ``topic`` on the admin stream, put to
    ``to_q_mgr``'s admin stream queue (no publisher identity, no response)."""
    md = _command_md(False, MsgType.DATAGRAM, self_q_mgr, b"")
    md.persistence = Persistence.NOT_PERSISTENT
    pairs = [
        ("MQPSCommand", "Publish"),
        ("MQPSRegOpts", "Anon"),
        ("MQPSPubOpts", "NoReg"),
        ("MQPSStreamName", ADMIN_STREAM),
        ("MQPSTopic", escape_char_topic(topic)),
    ]
    return OutboundMessage(to_q_mgr, ADMIN_STREAM, md, _rfh_body(pairs))


def delete_publication(
    to_q_mgr: str, stream: str, topics: list[str], *, self_q_mgr: str, persistence: int = 1
) -> OutboundMessage:
    """The MQRFH DeletePub of character-scheme ``topics`` of ``stream`` passed on to
    ``to_q_mgr``'s stream queue, with this broker's identity (so the neighbour does not
    send it back here)."""
    md = _command_md(False, MsgType.DATAGRAM, self_q_mgr, b"")
    md.persistence = persistence
    pairs = [("MQPSCommand", "DeletePub"), ("MQPSStreamName", stream)]
    pairs += [("MQPSTopic", t) for t in topics]
    pairs += [("MQPSQMgrName", self_q_mgr), ("MQPSQName", stream)]
    return OutboundMessage(to_q_mgr, stream, md, _rfh_body(pairs))


def delete_forwards(
    neighbours: Iterable[Neighbour],
    *,
    came_from: str,
    stream: str,
    scheme: Scheme,
    pattern: str,
    deleted_topics: list[str],
    self_q_mgr: str,
    persistence: int,
) -> list[OutboundMessage]:
    """A processed DeletePub (``pattern`` within ``stream``) passed on to every
    neighbour sharing the stream except ``came_from`` (its MQPSQMgrName, else its
    ReplyToQMgr): a hierarchy has no cycles, so it reaches every broker holding the
    retained publication once.

    MQRFH DeletePubs name character-scheme topics: a topic-scheme pattern without
    wildcards goes as its literal; one with wildcards cannot be expressed exactly (a
    wider pattern would delete too much), so the topics it deleted here go instead.
    """
    if scheme == Scheme.CHAR:
        topics = [pattern]
    elif not uses_topic_wildcards(pattern):
        topics = [escape_char_topic(pattern)]
    else:
        topics = [escape_char_topic(t) for t in deleted_topics]
    if not topics:
        return []
    return [
        delete_publication(n.q_mgr, stream, topics, self_q_mgr=self_q_mgr, persistence=persistence)
        for n in neighbours
        if n.q_mgr != came_from and stream in n.streams
    ]
