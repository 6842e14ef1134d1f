"""The ``config:`` section of one ``mqtt`` plugin instance (validated at the YAML boundary).

Defaults aim at a sidecar next to a local Mosquitto: MQTT 5, a persistent session under a
stable client id, persistent MQ messages at QoS 1, inbound filters at QoS 1 (the only
level at which MQTT lets a receiver defer its acknowledgement past a crash; see
docs/mqtt-plugin.md, "Guarantees").
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.plugin_api import DEFAULT_STREAM
from gateway.secrets import Secret

Qos = Literal[0, 1, 2]
_STREAM_NAME = re.compile(r"[A-Za-z0-9._%]{1,48}")


def _check_topic_name(value: str, what: str) -> str:
    """A literal MQTT topic part (no wildcards, no NUL, not a ``$`` topic)."""
    if any(ch in value for ch in "+#\0"):
        raise ValueError(f"{what} {value!r} may not contain '+', '#' or NUL")
    if value.startswith("$"):
        raise ValueError(f"{what} {value!r} may not start with '$' (reserved for the broker)")
    return value


class OutboundConfig(BaseModel):
    """MQ → MQTT: which MQ topics are forwarded and how they are named on MQTT."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    topics: list[str] = Field(default_factory=lambda: ["#"])
    """MQ topics the instance subscribes to, in unified form (``$SYS/STREAM/<s>/...``
    for a named stream). ``#`` is every topic of the default stream."""
    prefix: str = "mq"
    """Leading MQTT topic levels of every forwarded publication (may be empty)."""
    stream_levels: dict[str, str] = Field(default_factory=dict)
    """Stream name → MQTT level used instead of the stream name (``""``: no level)."""
    default_stream_level: str = ""
    """MQTT level for the default stream (empty: ``<prefix>/a/b``)."""
    qos_persistent: Qos = 1
    """QoS of persistent MQ publications (and of retained deletions)."""
    qos_non_persistent: Qos = 0
    """QoS of non-persistent MQ publications."""
    user_properties: bool = True
    """MQTT 5 only: forward MQRFH2 ``usr`` properties and MQRFH user name/value pairs as
    user properties, and MQMD Expiry as the message expiry interval."""
    message_expiry: bool = True
    """MQTT 5: an MQMD Expiry becomes the Message Expiry Interval."""
    convert_text: bool = True
    """Convert MQSTR payloads from their CCSID (EBCDIC, Latin-1, ...) to UTF-8, since
    MQTT consumers have no CCSID to go by; payloads already in UTF-8 pass unchanged."""
    ack_timeout: float = Field(default=30.0, gt=0)
    """How long ``send`` waits for PUBACK/PUBCOMP of one unit of work before failing it
    (the MQ unit of work is then backed out and offered again)."""

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.rstrip("/")
        return _check_topic_name(value, "outbound.prefix")

    @field_validator("default_stream_level")
    @classmethod
    def _default_level(cls, value: str) -> str:
        if "/" in value:
            raise ValueError("outbound.default_stream_level is one topic level: no '/'")
        return _check_topic_name(value, "outbound.default_stream_level")

    @field_validator("stream_levels")
    @classmethod
    def _levels(cls, value: dict[str, str]) -> dict[str, str]:
        for stream, level in value.items():
            if "/" in level:
                raise ValueError(f"outbound.stream_levels[{stream!r}] is one topic level: no '/'")
            _check_topic_name(level, f"outbound.stream_levels[{stream!r}]")
        return value

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        for topic in value:
            if not topic:
                raise ValueError("outbound.topics: an empty topic subscribes to nothing")
        return value


class InboundFilter(BaseModel):
    """MQTT → MQ: one MQTT subscription and where its messages are published in MQ."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    filter: str = Field(min_length=1)
    """MQTT topic filter (``+``, ``#``)."""
    qos: Qos = 1
    """QoS of the MQTT subscription. At 1 (default) an unacknowledged message is
    redelivered after a gateway crash; at 2 MQTT hands ownership over at PUBREC."""
    stream: str = DEFAULT_STREAM
    """MQ stream the messages are published on."""
    strip_prefix: str = ""
    """Leading MQTT levels removed before the topic enters MQ (e.g. ``"sensors/"``)."""
    topic_prefix: str = ""
    """Prepended to the (stripped) topic in MQ (e.g. ``"from-mqtt/"``)."""
    unescape: bool = True
    """Undo the outbound escaping (``%2B`` → ``+`` ...), so a round trip is lossless."""
    payload_format: str = Field(default="MQSTR", max_length=8)
    """MQ format of payloads not flagged UTF-8 by MQTT 5's payload format indicator."""
    ccsid: int = 1208
    """CCSID of the MQ message when MQTT 5's payload format indicator is not set."""

    @field_validator("stream")
    @classmethod
    def _stream(cls, value: str) -> str:
        if not _STREAM_NAME.fullmatch(value):
            raise ValueError(
                f"stream {value!r} is not an MQ queue name (1-48 of A-Z a-z 0-9 . _ %)"
            )
        return value

    @field_validator("filter")
    @classmethod
    def _filter(cls, value: str) -> str:
        levels = value.split("/")
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != len(levels) - 1):
                raise ValueError(f"inbound filter {value!r}: '#' must be a whole, last level")
            if "+" in level and level != "+":
                raise ValueError(f"inbound filter {value!r}: '+' must be a whole level")
        if "\0" in value:
            raise ValueError(f"inbound filter {value!r} contains NUL")
        return value


class InboundConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    filters: list[InboundFilter] = Field(default_factory=list)
    """The MQTT topic filters subscribed to, each with where its messages go."""
    batch_size: int = Field(default=64, ge=1, le=5000)
    """Most MQTT messages published into MQ under one unit of work."""
    receive_maximum: int = Field(default=256, ge=1, le=65535)
    """MQTT 5 Receive Maximum: unacknowledged QoS 1/2 messages the broker may send us."""
    dead_letter_topic: str = "mqgw/dead-letter"
    """Where a message MQ can never accept (e.g. an invalid stream) is republished (QoS
    1, the reason in user property ``mqgw-error``) before it is acknowledged; empty:
    it is logged and dropped."""

    @field_validator("dead_letter_topic")
    @classmethod
    def _dlt(cls, value: str) -> str:
        return _check_topic_name(value, "inbound.dead_letter_topic") if value else value


class TlsConfig(BaseModel):
    """``tls:`` of an instance: how the broker's certificate is checked and, optionally,
    the client certificate presented (docs/security.md, "MQTT: TLS and passwords")."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ca_file: str | None = None
    """PEM file of the CA(s) that signed the broker's certificate; none: the system's."""
    cert_file: str | None = None
    """PEM client certificate (and its chain) for brokers that require one."""
    key_file: str | None = None
    """PEM private key of ``cert_file`` (omit when the key is in ``cert_file``)."""
    key_password: Secret | None = None
    """Passphrase of an encrypted ``key_file``."""
    check_hostname: bool = True
    """Check that the certificate names ``host``. Turning it off lets anyone with a
    certificate from the same CA impersonate the broker: testing only."""
    tls_version: Literal["1.2", "1.3"] = "1.2"
    """Lowest TLS version accepted."""

    @model_validator(mode="after")
    def _pairs(self) -> TlsConfig:
        if (self.key_file is not None or self.key_password is not None) and not self.cert_file:
            raise ValueError("tls.key_file / tls.key_password need tls.cert_file")
        return self


class MqttConfig(BaseModel):
    """One MQTT plugin instance: a broker connection, outbound and inbound mappings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """The MQTT broker's host."""
    port: int = Field(default=1883, ge=1, le=65535)
    """The MQTT broker's port."""
    protocol: Literal["5", "3.1.1"] = "5"
    """MQTT protocol version: ``5`` or ``3.1.1``."""
    client_id: str = ""
    """Stable across restarts so the broker keeps our session; default
    ``mqgw-<gateway id>-<instance name>``."""
    username: str | None = None
    """MQTT user name and password (CONNECT); the password is a secret
    (``{env: NAME}``, ``{file: PATH}``), read at every connect."""
    password: Secret | None = None
    """The MQTT password; needs ``username``."""
    tls: TlsConfig | None = None
    """TLS to the broker (``tls: {}`` or ``tls: true``: system CAs, hostname checked)."""
    keepalive: int = Field(default=30, ge=5, le=65535)
    """MQTT keep-alive interval (seconds)."""
    session_expiry: int = Field(default=86_400, ge=0)
    """MQTT 5 Session Expiry Interval (seconds) of our persistent session."""
    max_inflight: int = Field(default=1000, ge=1, le=65535)
    """Unacknowledged outgoing QoS 1/2 publishes in flight (MQTT 5: capped by the
    broker's Receive Maximum)."""
    connect_timeout: float = Field(default=10.0, gt=0)
    """Longest wait for the broker's CONNACK and SUBACKs (seconds)."""
    reconnect_min_delay: float = Field(default=0.5, gt=0)
    """First pause before reconnecting after a lost connection (seconds, doubling)."""
    reconnect_max_delay: float = Field(default=30.0, gt=0)
    """Longest pause between reconnection attempts (seconds)."""
    outbound: OutboundConfig = Field(default_factory=OutboundConfig)
    """MQ to MQTT: which MQ topics are forwarded, and how."""
    inbound: InboundConfig = Field(default_factory=InboundConfig)
    """MQTT to MQ: which MQTT topic filters are published into which streams."""
    allow_echo: bool = False
    """Accept inbound filters that match our own outbound topics under MQTT 3.1.1 (which
    has no No Local option, so each forwarded publication would come back once)."""

    @model_validator(mode="before")
    @classmethod
    def _tls_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "ca_file" in data:
                raise ValueError("ca_file moved under tls: write tls: {ca_file: PATH}")
            if isinstance(data.get("tls"), bool):
                data = {**data, "tls": {} if data["tls"] else None}
        return data

    @field_validator("client_id")
    @classmethod
    def _client_id(cls, value: str) -> str:
        if len(value.encode()) > 65535:
            raise ValueError("client_id is longer than MQTT allows (65535 bytes)")
        return value

    @model_validator(mode="after")
    def _delays(self) -> MqttConfig:
        if self.reconnect_max_delay < self.reconnect_min_delay:
            raise ValueError("reconnect_max_delay must be >= reconnect_min_delay")
        if self.password is not None and self.username is None:
            raise ValueError("password needs username (MQTT sends no password without a user)")
        return self
