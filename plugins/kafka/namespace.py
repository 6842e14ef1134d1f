"""The Kafka topics one instance keeps for itself (``gateway.plugin_api.OwnsTopics``).

Why: request/reply lets an outside party name the topic the gateway writes a reply to
(``mq.reply.topic``). Written into one of the instance's own topics, that reply would
overwrite a retained value, pose as a dead letter, or come back into MQ through an
inbound route. The runtime asks :meth:`KafkaNamespace.own_topic` before it writes there.

Own: every name the outbound side can write -- for each configured route, the topic and
retained-topic templates the router picks for the route's subscription (the route's own
or, when the engine's subscription does not map back to it, the default templates), with
``{stream}`` rendered as the router renders that stream and ``{topic}`` standing for any
run of legal characters, possibly empty --, the inbound topics, the dead-letter topic,
the exactly-once marker topic, and Kafka's internal topics (``__...``). Streams no route
subscribes to are never written, so ``{stream}`` is no wildcard: with ``{stream}.{topic}``
a name such as ``app.replies`` stays free. Names are compared the way Kafka compares them
for collisions (``.`` and ``_`` alike): a colliding topic an outsider had made the gateway
create would stop it from creating its own. Pure and bounded: matching is linear in the
name's length (no regular expression that could backtrack on a hostile name), nothing is
remembered.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from gateway.plugin_api import split_unified_topic
from plugins.kafka.config import KafkaPluginConfig, OutboundConfig
from plugins.kafka.mapping import MAX_TOPIC_LENGTH, collision_key

#: Kafka keeps names starting with this for itself (__consumer_offsets, ...).
INTERNAL_PREFIX = "__"
#: The default exactly-once marker topic is ``mqgw-eos.<gateway id>.<instance>``.
EXACTLY_ONCE_PREFIX = "mqgw-eos."
_KAFKA_LEGAL = frozenset(string.ascii_letters + string.digits + "._-")


@dataclass(frozen=True, slots=True)
class NamePattern:
    """A topic name template as literal parts and the gaps between them.

    ``literals`` has one more element than ``gaps``; ``gaps[i]`` is the least number of
    characters between ``literals[i]`` and ``literals[i + 1]`` (adjacent placeholders
    are one gap: their runs cannot be told apart). A ``{topic}`` placeholder may be
    empty, any other (the gateway id of the default marker topic) is at least one
    character. ``keys`` are the literals' collision keys. ``what`` names the topic in the
    sentence :meth:`KafkaNamespace.own_topic` returns."""

    literals: tuple[str, ...]
    gaps: tuple[int, ...]
    what: str
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(map(collision_key, self.literals)))

    @classmethod
    def of_template(cls, template: str, what: str) -> NamePattern:
        """The pattern of a template text (a :class:`plugins.kafka.mapping.TopicTemplate`
        with ``{stream}`` rendered: :meth:`~plugins.kafka.mapping.TopicTemplate.shape`)."""
        literals: list[str] = [""]
        gaps: list[int] = []
        open_gap = False
        for literal, field, _spec, _conversion in string.Formatter().parse(template):
            if literal:
                if open_gap:
                    literals.append("")
                    open_gap = False
                literals[-1] += literal
            if field is None:
                continue
            least = 0 if field == "topic" else 1
            if open_gap:
                gaps[-1] += least
            else:
                gaps.append(least)
                open_gap = True
        if open_gap:
            literals.append("")
        return cls(tuple(literals), tuple(gaps), what)

    @classmethod
    def exact(cls, name: str, what: str) -> NamePattern:
        return cls((name,), (), what)

    @property
    def matches_every_name(self) -> bool:
        """No literal text and room for a one-character name: every topic fits."""
        return not any(self.literals) and sum(self.gaps) <= 1

    def matches(self, name: str, *, alike: bool = False) -> bool:
        """Does ``name`` fit (``alike``: ``name`` is a collision key, compared with the
        literals' keys)? Placing each middle literal leftmost is enough: a gap takes
        any characters, so an earlier placement never leaves less room after it."""
        literals = self.keys if alike else self.literals
        first, last = literals[0], literals[-1]
        if not self.gaps:
            return name == first
        if len(name) < sum(map(len, literals)) + sum(self.gaps):
            return False
        if not name.startswith(first) or not name.endswith(last):
            return False
        pos, end = len(first), len(name) - len(last)
        for gap, literal in zip(self.gaps[:-1], literals[1:-1], strict=True):
            found = name.find(literal, pos + gap, end)
            if found < 0:
                return False
            pos = found + len(literal)
        return end - pos >= self.gaps[-1]


class KafkaNamespace:
    """The own names of one ``kafka`` instance, from its configuration alone."""

    def __init__(self, config: KafkaPluginConfig, instance: str, gateway_id: str = "") -> None:
        """``gateway_id`` "" (not known before start): the default exactly-once marker
        topic of this instance under any gateway id is own."""
        self.instance = instance
        patterns: list[NamePattern] = []
        if config.outbound.enabled:
            patterns += outbound_patterns(config.outbound)
        patterns += [
            NamePattern.exact(t.kafka_topic, f"the inbound topic of stream {t.stream!r}")
            for t in config.inbound.topics
        ]
        dead_letter = config.inbound.dead_letter_topic
        if dead_letter:
            patterns.append(NamePattern.exact(dead_letter, "the dead-letter topic"))
        marker = "the exactly-once marker topic"
        if config.exactly_once_topic_name or gateway_id:
            name = config.exactly_once_topic(gateway_id, instance)
            patterns.append(NamePattern.exact(name, marker))
        else:
            template = f"{EXACTLY_ONCE_PREFIX}{{gateway_id}}.{instance}"
            patterns.append(NamePattern.of_template(template, marker))
        self.patterns = tuple(patterns)

    def every_topic_own(self) -> str:
        """Why every Kafka topic name is this instance's own (a template that is
        ``{topic}`` alone), or "" when some name is not: a requester's reply can then
        never be written through any instance of the plugin (``mqgw run --check``)."""
        for pattern in self.patterns:
            if pattern.matches_every_name:
                return f"every Kafka topic name is {pattern.what} of kafka instance " + repr(
                    self.instance
                )
        return ""

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` is this instance's own (one sentence), or "" when it is not.
        A name Kafka cannot hold is nobody's topic: "" (producing to it is refused)."""
        if not topic or len(topic) > MAX_TOPIC_LENGTH or not set(topic) <= _KAFKA_LEGAL:
            return ""
        key = collision_key(topic)
        if key.startswith(INTERNAL_PREFIX):
            return f"Kafka topic {topic!r} is in Kafka's internal namespace (names starting '__')"
        for pattern in self.patterns:
            if pattern.matches(key, alike=True):
                verb = "is" if pattern.matches(topic) else "collides ('.' and '_' alike) with"
                return f"Kafka topic {topic!r} {verb} {pattern.what} of kafka instance " + repr(
                    self.instance
                )
        return ""


def outbound_patterns(outbound: OutboundConfig) -> list[NamePattern]:
    """The names the outbound side can write, as the router picks them: each configured
    route subscribes to its unified topic; the engine's subscription is (stream, filter)
    of that topic, and the router takes the route of that pair, or its default route
    (the default templates) when none is configured for it, and renders ``{stream}``
    with the subscription's stream (escaped). Only ``{topic}`` is left open."""
    router = outbound.router()
    shapes: dict[str, str] = {}
    for configured in outbound.routes:
        stream, topic_filter = split_unified_topic(configured.unified_topic)
        route = router.route_for(stream, topic_filter)
        for template, kind in ((route.topic, "publications"),
                               (route.retained, "retained publications")):
            shapes.setdefault(
                template.shape(stream),
                f"a topic of the outbound {kind} of stream {stream!r} "
                f"(template {template.template!r})",
            )
    return [NamePattern.of_template(shape, what) for shape, what in shapes.items()]
