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

import re

from gateway.plugin_api import DEFAULT_STREAM, split_unified_topic
from plugins.mqtt.config import MqttConfig
from plugins.mqtt.mapping import escape_topic_text

#: A '%' that starts none of the escapes :func:`plugins.mqtt.mapping.escape_topic_text`
#: writes (``%25 %2B %23 %00``).
_STRAY_PERCENT = re.compile("%(?!25|2B|23|00)")


#: Longest topic shown in a reason (a hostile name may be 65,535 bytes long).
SHOWN_TOPIC = 120


def matches_filter(topic_filter: str, topic: str) -> bool:
    """Does ``topic_filter`` (``+`` one level, ``#`` the rest, zero levels included)
    match ``topic``? Levels are compared literally otherwise."""
    return _matches(topic_filter.split("/"), topic)


def unescaped(text: str, *, whole_name: bool) -> str | None:
    """The MQ topic text whose escape (:func:`plugins.mqtt.mapping.escape_topic_text`)
    is ``text``, or None when escaping never writes ``text``. ``whole_name``: ``text``
    is the whole MQTT name, where a leading ``$`` is written ``%24``. Linear, and no
    Python-level loop per character (a hostile name may be 65,535 bytes)."""
    if whole_name and text.startswith("$"):
        return None
    dollar = whole_name and text.startswith("%24")
    body = text[3:] if dollar else text
    if "+" in body or "#" in body or "\0" in body or _STRAY_PERCENT.search(body):
        return None
    if "%" in body:
        # Every '%' starts an escape, so the order of these cannot matter; %25 last.
        for code, char in (("%2B", "+"), ("%23", "#"), ("%00", "\0"), ("%25", "%")):
            body = body.replace(code, char)
    return "$" + body if dollar else body


def _matches(filter_levels: list[str], topic: str) -> bool:
    # Level by level in place (no split, no copies): the work grows with the filter,
    # not with a hostile topic's length or number of levels.
    pos, size = 0, len(topic)
    for level in filter_levels:
        if level == "#":
            return True
        if pos > size:  # the topic has no more levels
            return False
        end = topic.find("/", pos)
        if end < 0:
            end = size
        if level != "+" and (end - pos != len(level) or not topic.startswith(level, pos)):
            return False
        pos = end + 1
    return pos == size + 1


def _shown(topic: str) -> str:
    if len(topic) <= SHOWN_TOPIC:
        return repr(topic)
    return f"{topic[:SHOWN_TOPIC]!r}... ({len(topic)} characters)"


class MqttNamespace:
    """The own topics of one ``mqtt`` instance, from its configuration alone."""

    def __init__(self, config: MqttConfig, instance: str) -> None:
        self.config = config
        self.instance = instance
        ob = config.outbound
        #: (inbound filter, its levels): split once, not per name asked about
        self._filters = [(f.filter, f.filter.split("/")) for f in config.inbound.filters]
        #: (unified MQ filter, the levels of the topic filter within its stream, the
        #: stream's MQTT level)
        self._forwarded: list[tuple[str, list[str], str]] = []
        for unified in ob.topics:
            stream, within = split_unified_topic(unified)
            if stream == DEFAULT_STREAM:
                level = ob.default_stream_level
            else:
                level = escape_topic_text(ob.stream_levels.get(stream, stream))
            self._forwarded.append((unified, within.split("/"), level))

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` is this instance's own (one sentence), or "" when it is not."""
        if not topic:
            return ""
        whose = f"of mqtt instance {self.instance!r}"
        shown = _shown(topic)
        if topic.startswith("$"):
            return f"MQTT topic {shown} is a '$' topic, which MQTT brokers keep for themselves"
        dead_letter = self.config.inbound.dead_letter_topic
        if dead_letter and (topic == dead_letter or topic.startswith(dead_letter + "/")):
            return f"MQTT topic {shown} is under the dead-letter topic {dead_letter!r} {whose}"
        for topic_filter, filter_levels in self._filters:
            if _matches(filter_levels, topic):
                return f"MQTT topic {shown} matches the inbound filter {topic_filter!r} {whose}"
        ob = self.config.outbound
        if ob.topics and ob.prefix:
            if topic.startswith(ob.prefix + "/"):
                return f"MQTT topic {shown} is under the outbound prefix {ob.prefix!r} {whose}"
        elif ob.topics:
            forwarded = self.forwarded_from(topic)
            if forwarded is not None:
                unified, mq = forwarded
                return (
                    f"MQTT topic {shown} is where outbound topic {unified!r} {whose} "
                    f"forwards MQ topic {_shown(mq)}"
                )
        return ""

    def forwarded_from(self, topic: str) -> tuple[str, str] | None:
        """(outbound MQ filter, MQ topic) whose forwarded publications have the name
        ``topic``, or None: the inverse of :func:`plugins.mqtt.mapping.mqtt_topic`
        (prefix, stream level, escaped topic). Each stream level's candidate is worked
        out once, whatever the number of outbound topics."""
        if not topic:
            return None  # MQTT has no empty topic name
        prefix = self.config.outbound.prefix
        if prefix:
            if not topic.startswith(prefix + "/"):
                return None
            after_prefix = topic[len(prefix) + 1 :]
        else:
            after_prefix = topic
        candidates: dict[str, str | None] = {}
        for unified, within_levels, level in self._forwarded:
            if level not in candidates:
                candidates[level] = self._candidate(after_prefix, level, whole=not prefix)
            found = candidates[level]
            if found is not None and _matches(within_levels, found):
                return unified, found
        return None

    @staticmethod
    def _candidate(rest: str, level: str, *, whole: bool) -> str | None:
        """The MQ topic that ``level``/``rest`` is the forwarded name of."""
        if level:
            if not rest.startswith(level + "/"):
                return None
            rest, whole = rest[len(level) + 1 :], False
        return unescaped(rest, whole_name=whole)
