"""Pure mapping between MQ publications and Kafka records (docs/kafka-contract.md, v1).

No I/O here: topic-name escaping and templates, start-up collision detection, the record
key, value and headers of an outbound publication, and the inbound publication of a
consumed record. The sink and the source only move what this module computes.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.plugin_api import DEFAULT_STREAM, Delivery, InboundPublication, Publication
from gateway.wire.errors import WireError
from gateway.wire.folder import parse_folder
from gateway.wire.put_time import put_time_ms
from plugins.kafka.errors import TopicCollisionError, TopicNameError

CONTRACT_VERSION = b"1"
#: Kafka's longest legal topic name.
MAX_TOPIC_LENGTH = 249
STREAM_PREFIX = "$SYS/STREAM/"
_PLAIN = frozenset(string.ascii_letters + string.digits + ".-")
_KAFKA_LEGAL = frozenset(string.ascii_letters + string.digits + "._-")
_HEX = frozenset("0123456789ABCDEF")
_FIELDS = frozenset({"stream", "topic"})
#: MQPUBO_RETAIN_PUBLICATION, as carried in Publication.pub_opts.
_RETAIN_PUBLICATION = 0x2
_PERSISTENT = 1


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
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    #: True for the retained topic (created with cleanup.policy=compact).
    compacted: bool = False


def topic_within_stream(delivery: Delivery) -> str:
    """The MQ topic without its ``$SYS/STREAM/<stream>/`` prefix (the record key)."""
    topic = delivery.topic
    prefix = f"{STREAM_PREFIX}{delivery.publication.stream}/"
    if topic.startswith(prefix):
        return topic[len(prefix) :]
    return topic


@dataclass(frozen=True, slots=True)
class UsrProperty:
    """One property of an MQRFH2 ``usr`` folder (``dt``: its type attribute, or "")."""

    name: str
    text: str
    dt: str = ""


def usr_properties(folders: Iterable[str]) -> list[UsrProperty]:
    """The properties of every ``usr`` folder among ``folders`` (RFH2 folder XML text).

    Only the folders' direct children are properties (IBM: "usr folder" holds flat
    name/value elements); a folder that does not parse is skipped, not fatal.
    """
    props: list[UsrProperty] = []
    for text in folders:
        if "usr" not in text[:16]:
            continue
        try:
            root = parse_folder(text)
        except WireError:
            continue
        if root.name != "usr":
            continue
        props.extend(UsrProperty(c.name, c.text, c.attributes.get("dt", "")) for c in root.children)
    return props


def publisher_header_kind(pub: Publication) -> str:
    """``MQRFH`` or ``MQRFH2``: the header the publisher used.

    The engine records it on every publication it parsed; for one built elsewhere the
    header is told by what it carries (MQRFH user name/value pairs or not).
    """
    if pub.header:
        return pub.header
    return "MQRFH" if pub.user_pairs else "MQRFH2"


def record_headers(delivery: Delivery, origin: str) -> list[tuple[str, bytes]]:
    """The contract headers of a publication record (contract "Headers")."""
    pub, md = delivery.publication, delivery.md
    key = topic_within_stream(delivery)
    # The contract carries the *publisher's* MQMD identity, which the engine records
    # on the publication; the delivery's own MQMD is the broker's forwarding one.
    msg_id = pub.msg_id or md.msg_id
    correl_id = pub.correl_id or md.correl_id
    put_date, put_time = (
        (pub.put_date, pub.put_time) if pub.put_date else (md.put_date, md.put_time)
    )
    user = (pub.user_identifier or md.user_identifier).strip()
    headers: list[tuple[str, bytes]] = [
        ("mq.contract", CONTRACT_VERSION),
        ("mq.stream", pub.stream.encode()),
        ("mq.topic", key.encode()),
        ("mq.msgId", msg_id.ljust(24, b"\x00")[:24]),
        ("mq.correlId", correl_id.ljust(24, b"\x00")[:24]),
    ]
    ms = put_time_ms(put_date, put_time)
    if ms is not None:
        headers.append(("mq.putTime", str(ms).encode()))
    if user:
        headers.append(("mq.userId", user.encode()))
    headers += [
        ("mq.format", pub.payload_format.strip().encode()),
        ("mq.encoding", str(pub.payload_encoding).encode()),
        ("mq.ccsid", str(pub.payload_ccsid).encode()),
        ("mq.persistence", b"1" if md.persistence == _PERSISTENT else b"0"),
    ]
    headers.append(("mq.pubHeader", publisher_header_kind(pub).encode()))
    if pub.pub_opts & _RETAIN_PUBLICATION or delivery.retained:
        headers.append(("mq.retain", b"1"))
    if pub.seq_num:
        headers.append(("mq.seqNum", pub.seq_num.encode()))
    if pub.pub_time:
        headers.append(("mq.pubTime", pub.pub_time.encode()))
    headers.append(("mq.origin", origin.encode()))
    for prop in usr_properties(pub.extra_folders):
        headers.append((f"usr.{prop.name}", prop.text.encode()))
        if prop.dt:
            headers.append((f"mq.usrType.{prop.name}", prop.dt.encode()))
    for name, value in pub.user_pairs:
        if not name.startswith("MQPS"):
            headers.append((f"mq.nv.{name}", value.encode()))
    return headers


def tombstone_headers(stream: str, topic: str, origin: str) -> list[tuple[str, bytes]]:
    """Headers of a DeletePublication tombstone on the retained topic."""
    return [
        ("mq.contract", CONTRACT_VERSION),
        ("mq.stream", stream.encode()),
        ("mq.topic", topic.encode()),
        ("mq.origin", origin.encode()),
    ]


def is_deletion(delivery: Delivery) -> bool:
    """True for a delivery that reports a DeletePublication of a retained publication."""
    return delivery.deleted


def is_retain_request(delivery: Delivery) -> bool:
    """True when the publication is (or replaces) the retained one of its topic."""
    return bool(delivery.retained or delivery.publication.pub_opts & _RETAIN_PUBLICATION)


def outbound_records(delivery: Delivery, router: TopicRouter, origin: str) -> list[OutboundRecord]:
    """The Kafka records of one delivery.

    A live publication goes to its stream's topic, and also to the compacted retained
    topic when it was published with RetainPub. A retained publication handed over on
    (re)subscription goes only to the compacted topic (it was published live before,
    and compaction makes the repeat harmless). A deletion is a tombstone.
    """
    pub = delivery.publication
    sub = delivery.subscription
    route = router.route_for(sub[0], sub[2])
    topic = topic_within_stream(delivery)
    key = topic.encode()
    if is_deletion(delivery):
        retained_topic = router.topic_for(route, pub.stream, topic, retained=True)
        headers = tombstone_headers(pub.stream, topic, origin)
        return [OutboundRecord(retained_topic, key, None, headers, compacted=True)]
    headers = record_headers(delivery, origin)
    records: list[OutboundRecord] = []
    if not delivery.retained:
        main = router.topic_for(route, pub.stream, topic, retained=False)
        records.append(OutboundRecord(main, key, pub.payload, headers))
    if is_retain_request(delivery):
        retained_topic = router.topic_for(route, pub.stream, topic, retained=True)
        records.append(OutboundRecord(retained_topic, key, pub.payload, headers, compacted=True))
    return records


def is_from_origin(delivery: Delivery, instance: str) -> bool:
    """True when the publication came in through plugin instance ``instance``."""
    origin = delivery.publication.origin
    return bool(origin) and origin == instance


# ------------------------------------------------------------------ inbound ----------


@dataclass(frozen=True, slots=True)
class InboundRoute:
    """How records of one consumed Kafka topic become publications."""

    kafka_topic: str
    stream: str = DEFAULT_STREAM
    topic: str = ""
    retain: bool = False
    persistent: bool = True


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
    """Internal signal: the record cannot become a publication (``why`` says why)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def inbound_publication(
    route: InboundRoute,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes]] | Mapping[str, bytes],
    *,
    gateway_id: str,
    instance: str,
) -> InboundPublication | None:
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
    if gateway_id and _text(h.get("mq.origin")) == gateway_id:
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
    retain = route.retain or h.get("mq.retain") == b"1"
    correl = h.get("mq.correlId", b"")
    persistence = h.get("mq.persistence")
    if value is None and not retain:
        raise SkippedRecord("tombstone (null value) on a topic not mapped as retained")
    return InboundPublication(
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
