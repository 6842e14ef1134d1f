"""The Kafka topics one instance keeps for itself (``gateway.plugin_api.OwnsTopics``).

Why: request/reply lets an outside party name the topic the gateway writes a reply to
(``mq.reply.topic``). Written into one of the instance's own topics, that reply would
overwrite a retained value, pose as a dead letter, or come back into MQ through an
inbound route. The runtime asks :meth:`KafkaNamespace.own_topic` before it writes there.

Own is conservative: every name an outbound route's topic or retained-topic template
could render for any stream and MQ topic (a placeholder stands for any run of legal
characters: non-empty for ``{stream}``, possibly empty for ``{topic}``), the inbound
topics, the dead-letter topic, the exactly-once marker topic, and Kafka's internal
topics (``__...``). Names are compared the way Kafka compares them for collisions
(``.`` and ``_`` alike): a colliding topic an outsider had made the gateway create would
stop it from creating its own. Pure and bounded: matching is linear in the name's length
(no regular expression that could backtrack on a hostile name), nothing is remembered.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from plugins.kafka.config import KafkaPluginConfig
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
    are one gap: their runs cannot be told apart). ``keys`` are the literals' collision
    keys. ``what`` names the topic in the sentence :meth:`KafkaNamespace.own_topic`
    returns."""

    literals: tuple[str, ...]
    gaps: tuple[int, ...]
    what: str
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(map(collision_key, self.literals)))

    @classmethod
    def of_template(cls, template: str, what: str) -> NamePattern:
        """The pattern of a :class:`plugins.kafka.mapping.TopicTemplate` text."""
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
            least = 1 if field == "stream" else 0
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
        outbound = config.outbound
        if outbound.enabled:
            templates = {
                outbound.topic_template: "publications",
                outbound.retained_topic_template: "retained publications",
            }
            for route in outbound.routes:
                if route.kafka_topic:
                    templates.setdefault(route.kafka_topic, "publications")
                if route.retained_topic:
                    templates.setdefault(route.retained_topic, "retained publications")
            patterns += [
                NamePattern.of_template(t, f"a topic of the outbound {kind} (template {t!r})")
                for t, kind in templates.items()
            ]
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
            template = f"{EXACTLY_ONCE_PREFIX}{{stream}}.{instance}"
            patterns.append(NamePattern.of_template(template, marker))
        self.patterns = tuple(patterns)

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
