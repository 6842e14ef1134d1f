"""Pure mapping between MQ publications and Kafka records (docs/kafka-contract.md, v1).

No I/O here: topic-name escaping and templates, start-up collision detection, the record
key, value and headers of an outbound publication, and the inbound publication of a
consumed record. The sink and the source only move what this module computes.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.plugin_api import DEFAULT_STREAM, STREAM_PREFIX, Envelope
from plugins.kafka.errors import TopicCollisionError, TopicNameError

CONTRACT_VERSION = b"1"
#: The header naming the gateway that wrote a record (contract "Headers"): its
#: inbound routes and request/reply sources never take such a record back.
ORIGIN_HEADER = "mq.origin"
#: Kafka's longest legal topic name.
MAX_TOPIC_LENGTH = 249
_PLAIN = frozenset(string.ascii_letters + string.digits + ".-")
_KAFKA_LEGAL = frozenset(string.ascii_letters + string.digits + "._-")
_HEX = frozenset("0123456789ABCDEF")
_FIELDS = frozenset({"stream", "topic"})


# ------------------------------------------------------------------ topic names -------


def escape_name(text: str) -> str:
    """Escape ``text`` into Kafka's alphabet (contract "Topic names").

    ``A-Z a-z 0-9 . -`` stand for themselves; every other character, ``_`` included,
    becomes ``_XX`` per UTF-8 byte, so the escape is exact and reversible.
    """
    if all(c in _PLAIN for c in text):
        return text
    out: list[str] = []
    for c in text:
        if c in _PLAIN:
            out.append(c)
        else:
            out.extend(f"_{b:02X}" for b in c.encode("utf-8"))
    return "".join(out)


def unescape_name(name: str) -> str:
    """Inverse of :func:`escape_name`; raises TopicNameError on a malformed escape."""
    if "_" not in name:
        return name
    raw = bytearray()
    i = 0
    while i < len(name):
        c = name[i]
        if c == "_":
            digits = name[i + 1 : i + 3]
            if len(digits) != 2 or not set(digits) <= _HEX:
                raise TopicNameError(
                    f"malformed escape at offset {i} of {name!r}", template="", name=name
                )
            raw.append(int(digits, 16))
            i += 3
        else:
            raw.extend(c.encode("ascii"))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopicNameError(f"escape of {name!r} is not UTF-8", template="", name=name) from exc


def collision_key(name: str) -> str:
    """Kafka's own collision rule: names equal once ``.`` and ``_`` are alike collide."""
    return name.replace(".", "_")


def check_topic_name(name: str, template: str) -> str:
    """Return ``name`` if Kafka accepts it as a topic name, else raise TopicNameError."""
    if not name or name in (".", ".."):
        raise TopicNameError(
            f"template {template!r} renders {name!r}", template=template, name=name
        )
    if len(name) > MAX_TOPIC_LENGTH:
        raise TopicNameError(
            f"template {template!r} renders a {len(name)}-character topic name "
            f"(Kafka allows {MAX_TOPIC_LENGTH}): {name[:60]}...",
            template=template,
            name=name,
        )
    bad = sorted({c for c in name if c not in _KAFKA_LEGAL})
    if bad:
        raise TopicNameError(
            f"template {template!r} renders {name!r} with characters Kafka refuses: {bad}",
            template=template,
            name=name,
        )
    return name


@dataclass(frozen=True, slots=True)
class TopicTemplate:
    """A Kafka topic name template with ``{stream}`` and ``{topic}`` (escaped values)."""

    template: str
    uses_topic: bool

    @classmethod
    def parse(cls, template: str) -> TopicTemplate:
        """Validate ``template``: only ``{stream}``/``{topic}``, Kafka-legal literal text."""
        fields: set[str] = set()
        try:
            parts = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise TopicNameError(f"template {template!r}: {exc}", template=template) from exc
        for literal, name, spec, conversion in parts:
            bad = sorted({c for c in literal if c not in _KAFKA_LEGAL})
            if bad:
                raise TopicNameError(
                    f"template {template!r} has characters Kafka refuses in topic names: "
                    f"{bad} (allowed: a-z A-Z 0-9 . _ -)",
                    template=template,
                )
            if name is None:
                continue
            if name not in _FIELDS or spec or conversion:
                raise TopicNameError(
                    f"template {template!r} uses {{{name}}}: only {{stream}} and {{topic}} "
                    "are known (no format specs)",
                    template=template,
                )
            fields.add(name)
        if not template:
            raise TopicNameError("a Kafka topic template must not be empty", template=template)
        return cls(template, "topic" in fields)

    def render(self, stream: str, topic: str = "") -> str:
        """The Kafka topic for ``topic`` within ``stream`` (checked against Kafka's rules)."""
        name = self.template.format(stream=escape_name(stream), topic=escape_name(topic))
        return check_topic_name(name, self.template)

    def shape(self, stream: str) -> str:
        """The name with ``{stream}`` rendered and ``{topic}`` left as a marker, for
        start-up collision checks of templates that depend on the MQ topic."""
        return self.template.replace("{stream}", escape_name(stream))


@dataclass(frozen=True, slots=True)
class Route:
    """Where publications matched by one outbound subscription go."""

    stream: str
    topic_filter: str
    topic: TopicTemplate
    retained: TopicTemplate

    @property
    def description(self) -> str:
        return f"stream {self.stream!r} topic filter {self.topic_filter!r}"


@dataclass(slots=True)
class _Claim:
    name: str
    owner: tuple[str, str]  # (kind, stream): one owner may reuse its own name
    source: str


class TopicRouter:
    """Maps (stream, topic) to Kafka topic names and refuses colliding names.

    Routes are keyed by the engine subscription that matched (stream, topic filter).
    Static names are checked at construction (so a bad config fails at start-up, naming
    both sources); names of ``{topic}`` templates are checked again as they appear.
    """

    def __init__(self, routes: Sequence[Route], fallback: Route) -> None:
        self._routes = {(r.stream, r.topic_filter): r for r in routes}
        self._fallback = fallback
        self._claims: dict[str, _Claim] = {}
        self._known: dict[tuple[str, str, str], str] = {}
        for r in routes:
            for kind, tmpl in (("publications", r.topic), ("retained publications", r.retained)):
                rendered = tmpl.shape(r.stream) if tmpl.uses_topic else tmpl.render(r.stream)
                if not tmpl.uses_topic:
                    self._known[(kind, r.stream, "")] = rendered
                self._claim(rendered, kind, r.stream, f"{kind} of {r.description}")

    @property
    def routes(self) -> list[Route]:
        return list(self._routes.values())

    def static_topics(self) -> dict[str, bool]:
        """Kafka topics known at start-up -> whether they are compacted (retained)."""
        return {name: kind.startswith("retained") for (kind, _s, _t), name in self._known.items()}

    def route_for(self, stream: str, topic_filter: str) -> Route:
        return self._routes.get((stream, topic_filter), self._fallback)

    def topic_for(self, route: Route, stream: str, topic: str, *, retained: bool) -> str:
        """The Kafka topic of ``topic`` in ``stream`` (the compacted one if ``retained``)."""
        tmpl = route.retained if retained else route.topic
        kind = "retained publications" if retained else "publications"
        cache_key = (kind, stream, topic if tmpl.uses_topic else "")
        name = self._known.get(cache_key)
        if name is None:
            name = tmpl.render(stream, topic)
            self._claim(name, kind, stream, f"{kind} of stream {stream!r} topic {topic!r}")
            self._known[cache_key] = name
        return name

    def _claim(self, name: str, kind: str, stream: str, source: str) -> None:
        key = collision_key(name)
        owner = (kind, stream)
        claim = self._claims.get(key)
        if claim is None:
            self._claims[key] = _Claim(name, owner, source)
            return
        if claim.name == name and claim.owner == owner:
            return  # two filters of one stream sharing a topic: intended merging
        raise TopicCollisionError(claim.source, source, claim.name, name)


# ------------------------------------------------------------------ outbound ---------


@dataclass(slots=True)
class OutboundRecord:
    """One Kafka record to produce (``value`` None: a tombstone)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    #: True for the retained topic (created with cleanup.policy=compact).
    compacted: bool = False


def _data_headers(
    payload_format: str, encoding: int, ccsid: int, persistent: bool, publisher_header: str
) -> tuple[tuple[str, bytes], ...]:
    """The headers that describe a publication's data and how it was published."""
    return (
        ("mq.format", payload_format.strip().encode()),
        ("mq.encoding", str(encoding).encode()),
        ("mq.ccsid", str(ccsid).encode()),
        ("mq.persistence", b"1" if persistent else b"0"),
        ("mq.pubHeader", publisher_header.encode()),
    )


#: :func:`_data_headers` by their arguments: a stream's publications repeat a few
#: (formatting them again cost a microsecond a record). Bounded, oldest first out.
_DATA_HEADERS: dict[tuple[str, int, int, bool, str], tuple[tuple[str, bytes], ...]] = {}
_DATA_HEADERS_MAX = 64


def record_headers(envelope: Envelope, origin: str) -> list[tuple[str, bytes]]:
    """The contract headers of a publication record (contract "Headers")."""
    e = envelope
    headers: list[tuple[str, bytes]] = [
        ("mq.contract", CONTRACT_VERSION),
        ("mq.stream", e.stream.encode()),
        ("mq.topic", e.topic.encode()),
        ("mq.msgId", e.msg_id.ljust(24, b"\x00")[:24]),
        ("mq.correlId", e.correl_id.ljust(24, b"\x00")[:24]),
    ]
    if e.put_time_ms is not None:
        headers.append(("mq.putTime", str(e.put_time_ms).encode()))
    if e.user_identifier:
        headers.append(("mq.userId", e.user_identifier.encode()))
    described = (e.payload_format, e.encoding, e.ccsid, e.persistent, e.publisher_header)
    data_headers = _DATA_HEADERS.get(described)
    if data_headers is None:
        data_headers = _data_headers(*described)
        if len(_DATA_HEADERS) >= _DATA_HEADERS_MAX:
            del _DATA_HEADERS[next(iter(_DATA_HEADERS))]
        _DATA_HEADERS[described] = data_headers
    headers += data_headers
    if e.retain:
        headers.append(("mq.retain", b"1"))
    if e.sequence_number:
        headers.append(("mq.seqNum", e.sequence_number.encode()))
    if e.publish_timestamp:
        headers.append(("mq.pubTime", e.publish_timestamp.encode()))
    headers.append((ORIGIN_HEADER, origin.encode()))
    for name, text in e.property_items():
        headers.append((f"usr.{name}", text.encode()))
        dt = e.property_types.get(name)
        if dt:
            headers.append((f"mq.usrType.{name}", dt.encode()))
    for name, value in e.name_value_pairs:
        if not name.startswith("MQPS"):
            headers.append((f"mq.nv.{name}", value.encode()))
    return headers


def tombstone_headers(stream: str, topic: str, origin: str) -> list[tuple[str, bytes]]:
    """Headers of a DeletePublication tombstone on the retained topic."""
    return [
        ("mq.contract", CONTRACT_VERSION),
        ("mq.stream", stream.encode()),
        ("mq.topic", topic.encode()),
        (ORIGIN_HEADER, origin.encode()),
    ]


def outbound_records(envelope: Envelope, router: TopicRouter, origin: str) -> list[OutboundRecord]:
    """The Kafka records of one envelope.

    A live publication goes to its stream's topic, and also to the compacted retained
    topic when it was published with RetainPub. A retained publication handed over on
    (re)subscription goes only to the compacted topic (it was published live before,
    and compaction makes the repeat harmless). A deletion is a tombstone.
    """
    e = envelope
    route = router.route_for(e.subscription_stream, e.subscription_filter)
    key = e.topic.encode()
    if e.delete:
        retained_topic = router.topic_for(route, e.stream, e.topic, retained=True)
        headers = tombstone_headers(e.stream, e.topic, origin)
        return [OutboundRecord(retained_topic, key, None, headers, compacted=True)]
    headers = record_headers(e, origin)
    records: list[OutboundRecord] = []
    if not e.from_retained_store:
        main = router.topic_for(route, e.stream, e.topic, retained=False)
        records.append(OutboundRecord(main, key, e.payload, headers))
    if e.retain:
        retained_topic = router.topic_for(route, e.stream, e.topic, retained=True)
        records.append(OutboundRecord(retained_topic, key, e.payload, headers, compacted=True))
    return records


def is_from_origin(envelope: Envelope, instance: str) -> bool:
    """True when the publication came in through plugin instance ``instance``."""
    return bool(envelope.origin) and envelope.origin == instance


# ------------------------------------------------------------------ inbound ----------


#: MQRCCF_NOT_AUTHORIZED: the reason (``mq.dlh.reason``) of a record whose ``mq.stream``
#: (or ``$SYS/STREAM/`` topic) is outside its route's ``allowed_streams``.
NOT_AUTHORIZED_REASON = 3081
#: MQRC_NOT_AUTHORIZED: the reason of a record of this gateway's own origin on a
#: request/reply source (the gateway wrote it; plugins.kafka.exchange).
OWN_ORIGIN_REASON = 2035


@dataclass(frozen=True, slots=True)
class InboundRoute:
    """How records of one consumed Kafka topic become publications.

    ``allowed_streams``: the streams a record may choose (``mq.stream`` header or a
    ``$SYS/STREAM/`` topic); None means only ``stream``."""

    kafka_topic: str
    stream: str = DEFAULT_STREAM
    topic: str = ""
    retain: bool = False
    persistent: bool = True
    allowed_streams: frozenset[str] | None = None

    def allows(self, stream: str) -> bool:
        """May a record of this route publish on ``stream``?"""
        return stream == self.stream or (
            self.allowed_streams is not None and stream in self.allowed_streams
        )


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _int(raw: bytes | None, default: int) -> int:
    text = _text(raw)
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        return default


class SkippedRecord(Exception):
    """Internal signal: the record cannot become a publication (``why`` says why;
    ``reason`` is the MQ reason code of its dead letter, 0 when it has none)."""

    def __init__(self, why: str, reason: int = 0) -> None:
        super().__init__(why)
        self.why = why
        self.reason = reason


def inbound_publication(
    route: InboundRoute,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes],
    *,
    gateway_id: str,
    instance: str,
) -> Envelope | None:
    """The publication of one consumed record (contract "Inbound"), or None when the
    record is this gateway's own (``mq.origin``). Raises SkippedRecord when the record
    has no usable topic."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    h: dict[str, bytes] = {}
    props: dict[str, str] = {}
    for name, raw in items:
        if name.startswith("usr.") and len(name) > 4:
            text = _text(raw)
            if text is not None:
                props[name[4:]] = text
        else:
            h[name] = raw
    if gateway_id and _text(h.get(ORIGIN_HEADER)) == gateway_id:
        return None
    stream = _text(h.get("mq.stream")) or route.stream
    topic = _text(h.get("mq.topic")) or _text(key) or route.topic
    if not topic:
        raise SkippedRecord("record has no mq.topic header, no UTF-8 key and the route no topic")
    if topic.startswith(STREAM_PREFIX):
        rest = topic[len(STREAM_PREFIX) :]
        stream, _, topic = rest.partition("/")
        if not stream or not topic:
            raise SkippedRecord(f"malformed stream topic {topic!r}")
    if not route.allows(stream):
        raise SkippedRecord(
            f"stream {stream!r} is not allowed for records of Kafka topic "
            f"{route.kafka_topic!r} (allowed_streams: "
            f"{', '.join(sorted({route.stream, *(route.allowed_streams or ())}))})",
            NOT_AUTHORIZED_REASON,
        )
    retain = route.retain or h.get("mq.retain") == b"1"
    correl = h.get("mq.correlId", b"")
    persistence = h.get("mq.persistence")
    if value is None and not retain:
        raise SkippedRecord("tombstone (null value) on a topic not mapped as retained")
    return Envelope(
        stream=stream,
        topic=topic,
        payload=value or b"",
        payload_format=(_text(h.get("mq.format")) if "mq.format" in h else "MQSTR") or "",
        encoding=_int(h.get("mq.encoding"), 546),
        ccsid=_int(h.get("mq.ccsid"), 1208),
        properties=props,
        persistent=route.persistent if persistence is None else persistence == b"1",
        retain=retain,
        delete=value is None,
        correl_id=correl if len(correl) == 24 else b"",
        origin=instance,
    )
