"""The MQTT topics one instance keeps for itself (``gateway.plugin_api.OwnsTopics``).

Why: request/reply lets an outside party name the topic the gateway publishes a reply
to (the MQTT 5 Response Topic). Published on one of the instance's own topics, that
reply would pose as a forwarded MQ publication (overwriting a retained one), as a dead
letter, or come back into MQ through an inbound filter. The runtime asks
:meth:`MqttNamespace.own_topic` before it publishes there.

Own: every ``$`` topic (MQTT brokers keep them: ``$SYS/...``); the dead-letter topic and
everything under it; every topic an inbound filter matches; and every topic a forwarded
publication can have -- with an outbound prefix, everything under it; without one,
exactly the names that map back (docs/mqtt-plugin.md, "Topic mapping") to an MQ topic
one of ``outbound.topics`` matches. Filters match here without MQTT's rule that
wildcards skip ``$`` topics, and a ``#`` that is not last matches the rest: wider,
never narrower. Pure, linear in the name's length, nothing remembered.
"""

from __future__ import annotations

from gateway.plugin_api import DEFAULT_STREAM, split_unified_topic
from plugins.mqtt.config import MqttConfig
from plugins.mqtt.mapping import MappingError, escape_topic_text, mqtt_topic, unescape_topic_text


def matches_filter(topic_filter: str, topic: str) -> bool:
    """Does ``topic_filter`` (``+`` one level, ``#`` the rest, zero levels included)
    match ``topic``? Levels are compared literally otherwise."""
    levels = topic.split("/")
    for i, level in enumerate(topic_filter.split("/")):
        if level == "#":
            return True
        if i >= len(levels) or level not in ("+", levels[i]):
            return False
    return len(topic_filter.split("/")) == len(levels)


class MqttNamespace:
    """The own topics of one ``mqtt`` instance, from its configuration alone."""

    def __init__(self, config: MqttConfig, instance: str) -> None:
        self.config = config
        self.instance = instance
        ob = config.outbound
        #: (unified MQ filter, its stream, the topic filter within it, the stream's level)
        self._forwarded: list[tuple[str, str, str, str]] = []
        for unified in ob.topics:
            stream, within = split_unified_topic(unified)
            if stream == DEFAULT_STREAM:
                level = ob.default_stream_level
            else:
                level = escape_topic_text(ob.stream_levels.get(stream, stream))
            self._forwarded.append((unified, stream, within, level))

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` is this instance's own (one sentence), or "" when it is not."""
        if not topic:
            return ""
        whose = f"of mqtt instance {self.instance!r}"
        if topic.startswith("$"):
            return f"MQTT topic {topic!r} is a '$' topic, which MQTT brokers keep for themselves"
        dead_letter = self.config.inbound.dead_letter_topic
        if dead_letter and (topic == dead_letter or topic.startswith(dead_letter + "/")):
            return f"MQTT topic {topic!r} is under the dead-letter topic {dead_letter!r} {whose}"
        for f in self.config.inbound.filters:
            if matches_filter(f.filter, topic):
                return f"MQTT topic {topic!r} matches the inbound filter {f.filter!r} {whose}"
        ob = self.config.outbound
        if ob.topics and ob.prefix:
            if topic.startswith(ob.prefix + "/"):
                return f"MQTT topic {topic!r} is under the outbound prefix {ob.prefix!r} {whose}"
        elif ob.topics:
            forwarded = self.forwarded_from(topic)
            if forwarded is not None:
                unified, mq = forwarded
                return (
                    f"MQTT topic {topic!r} is where outbound topic {unified!r} {whose} "
                    f"forwards MQ topic {mq!r}"
                )
        return ""

    def forwarded_from(self, topic: str) -> tuple[str, str] | None:
        """(outbound MQ filter, MQ topic) whose forwarded publications have the name
        ``topic``, or None: the inverse of :func:`plugins.mqtt.mapping.mqtt_topic`,
        checked by mapping the candidate forward again."""
        prefix = self.config.outbound.prefix
        if prefix:
            if not topic.startswith(prefix + "/"):
                return None
            topic_after_prefix = topic[len(prefix) + 1 :]
        else:
            topic_after_prefix = topic
        for unified, stream, within, level in self._forwarded:
            rest = topic_after_prefix
            if level:
                if not rest.startswith(level + "/"):
                    continue
                rest = rest[len(level) + 1 :]
            candidate = unescape_topic_text(rest)
            try:
                if mqtt_topic(stream, candidate, self.config.outbound) != topic:
                    continue
            except (MappingError, UnicodeEncodeError):  # a name MQTT cannot carry
                continue
            if matches_filter(within, candidate):
                return unified, candidate
        return None
