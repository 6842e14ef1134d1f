"""Pure mapping between MQ publications and MQTT messages (names, properties, expiry).

The topic rule (docs/mqtt-plugin.md, "Topic mapping"): a publication on topic ``a/b`` of
stream ``S`` becomes ``<prefix>/<S>/a/b`` (the default stream: ``<prefix>/a/b``). MQ's
``$SYS/STREAM/`` prefix never reaches MQTT. Characters an MQTT topic name may not hold
(``+``, ``#``, NUL; a leading ``$`` marks broker topics) are percent-escaped, and so is
``%`` itself, which makes the rule reversible: ``%`` → ``%25``, ``+`` → ``%2B``, ``#`` →
``%23``, NUL → ``%00``, a leading ``$`` → ``%24``. References: MQTT 3.1.1 §4.7, MQTT 5.0
§4.7 (topic names and filters), WMQ Publish/Subscribe streams (reference §5.8).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

from gateway.plugin_api import DEFAULT_STREAM, PROPERTY_NAME, Envelope, split_unified_topic
from plugins.mqtt.config import InboundFilter, OutboundConfig

#: MQTT's Message Expiry Interval is a four-byte integer (MQTT 5.0 §3.3.2.3.3).
MAX_EXPIRY_INTERVAL = 0xFFFF_FFFF
#: The MQTT 5 user property naming the gateway that published a message (its id) on
#: what its request/reply exchanges produce and on its dead letters: its inbound filters
#: and exchange sources never take such a message back. Only the gateway sets it: an
#: MQ property of this name is never forwarded (:func:`user_properties`).
ORIGIN_PROPERTY = "mqgw-origin"

_ESCAPES = {"%": "%25", "+": "%2B", "#": "%23", "\0": "%00"}
_ESCAPE_RE = re.compile("[%+#\0]")
_UNESCAPES = {"25": "%", "2B": "+", "23": "#", "00": "\0", "24": "$"}
_UNESCAPE_RE = re.compile("%(25|2[bB]|23|00|24)")


class MappingError(ValueError):
    """A name cannot be mapped (carries the offending ``value``)."""

    def __init__(self, message: str, value: str) -> None:
        super().__init__(message)
        self.value = value


def escape_topic_text(text: str) -> str:
    """Escape the characters MQTT forbids in a topic name (and ``%``, the escape)."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], text)


def unescape_topic_text(text: str) -> str:
    """Inverse of :func:`escape_topic_text` (and of the leading-``$`` escape)."""
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES[m.group(1).upper()], text)


def mqtt_topic(stream: str, topic: str, config: OutboundConfig) -> str:
    """The MQTT topic name of ``topic`` in ``stream`` (never a ``$`` topic)."""
    levels: list[str] = []
    if config.prefix:
        levels.append(config.prefix)
    if stream == DEFAULT_STREAM:
        stream_level = config.default_stream_level
    else:
        stream_level = escape_topic_text(config.stream_levels.get(stream, stream))
    if stream_level:
        levels.append(stream_level)
    levels.append(escape_topic_text(topic))
    name = "/".join(levels)
    if not name:
        raise MappingError("an empty MQ topic on the default stream with no prefix", topic)
    if name.startswith("$"):
        name = "%24" + name[1:]
    if len(name.encode("utf-8")) > 65535:
        raise MappingError("the MQTT topic would exceed 65535 bytes", topic)
    return name


def mq_topic(mqtt_name: str, inbound: InboundFilter) -> str:
    """The MQ topic (inside ``inbound.stream``) of a message received on ``mqtt_name``."""
    name = mqtt_name
    if inbound.strip_prefix and name.startswith(inbound.strip_prefix):
        name = name[len(inbound.strip_prefix) :]
    if inbound.unescape:
        name = unescape_topic_text(name)
    name = inbound.topic_prefix + name
    if not name:
        raise MappingError("the MQ topic would be empty", mqtt_name)
    if inbound.stream == DEFAULT_STREAM:
        # A default-stream topic "$SYS/STREAM/S/..." is stream S's: an MQTT message
        # cannot choose its stream (docs/security.md), only the filter's config does.
        chosen, _ = split_unified_topic(name)
        if chosen != DEFAULT_STREAM:
            raise MappingError(
                f"the MQ topic would choose stream {chosen!r}: not authorised (the "
                f"filter {inbound.filter!r} publishes on {DEFAULT_STREAM} only)",
                mqtt_name,
            )
    return name


def qos_for(persistent: bool, config: OutboundConfig) -> int:
    """Persistent → ``qos_persistent``; anything else → ``qos_non_persistent``."""
    return config.qos_persistent if persistent else config.qos_non_persistent


def expiry_interval(mq_expiry: int) -> int | None:
    """MQMD Expiry (tenths of a second, -1 unlimited) → MQTT seconds, rounded up."""
    if mq_expiry <= 0:
        return None
    return min(MAX_EXPIRY_INTERVAL, max(1, math.ceil(mq_expiry / 10)))


def mq_expiry(interval: int | None) -> int:
    """MQTT Message Expiry Interval (seconds) → MQMD Expiry (tenths, -1 unlimited)."""
    if interval is None:
        return -1
    return min(0x7FFF_FFFF, max(1, interval * 10))


def _clean(text: str) -> str:
    # MQTT UTF-8 strings must not hold U+0000 (MQTT 5.0 §1.5.4).
    return text.replace("\0", "\ufffd")


def user_properties(envelope: Envelope) -> list[tuple[str, str]]:
    """MQRFH user name/value pairs, then MQRFH2 ``usr`` properties (groups dotted),
    except any named :data:`ORIGIN_PROPERTY`: an MQ publisher must not make a message
    pose as some gateway's own (that gateway would skip it)."""
    pairs = [(_clean(n), _clean(v)) for n, v in envelope.name_value_pairs]
    pairs.extend((_clean(n), _clean(v)) for n, v in envelope.property_items())
    if any(name == ORIGIN_PROPERTY for name, _ in pairs):
        return [(name, value) for name, value in pairs if name != ORIGIN_PROPERTY]
    return pairs


def has_origin(pairs: Iterable[tuple[str, str]], gateway_id: str) -> bool:
    """Do the MQTT 5 user properties ``pairs`` name ``gateway_id`` as the origin?"""
    return bool(gateway_id) and (ORIGIN_PROPERTY, gateway_id) in pairs


def mq_properties(pairs: Iterable[tuple[str, str]]) -> tuple[dict[str, str], int]:
    """MQTT 5 user properties → MQ ``usr`` properties: those whose name MQ can carry
    (an XML name), and how many were dropped."""
    properties: dict[str, str] = {}
    dropped = 0
    for name, value in pairs:
        if PROPERTY_NAME.fullmatch(name):
            properties[name] = value
        else:
            dropped += 1
    return properties, dropped


def check_topic_name(topic: str) -> str:
    """``topic`` when MQTT can publish to it (MQTT 5.0 §4.7.3); MappingError otherwise."""
    if not topic:
        raise MappingError("an empty MQTT topic name", topic)
    if any(c in topic for c in "+#\0"):
        raise MappingError("an MQTT topic name holds no '+', '#' or NUL", topic)
    if len(topic.encode("utf-8")) > 65535:
        raise MappingError("the MQTT topic exceeds 65535 bytes", topic)
    return topic


def filter_levels_overlap(topic_filter: str, prefix: str) -> bool:
    """True when ``topic_filter`` can match a topic below ``prefix`` (our own output)."""
    f_levels = topic_filter.split("/")
    p_levels = prefix.split("/") if prefix else []
    for i, level in enumerate(p_levels):
        if i >= len(f_levels):
            return False
        if f_levels[i] == "#":
            return True
        if f_levels[i] not in ("+", level):
            return False
    return len(f_levels) > len(p_levels)


def echo_filters(filters: Iterable[InboundFilter], prefix: str) -> Sequence[str]:
    """The inbound filters that would receive the instance's own outbound publications."""
    return [f.filter for f in filters if filter_levels_overlap(f.filter, prefix)]
