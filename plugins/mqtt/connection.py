"""One paho-mqtt client driven from the asyncio event loop, with manual acknowledgement.

Why not aiomqtt: aiomqtt 2.x acknowledges every received QoS 1/2 message as soon as it
arrives, before the gateway has committed it to MQ. paho-mqtt 2.x can defer the
acknowledgement (``manual_ack=True`` + ``Client.ack(mid, qos)``).

Why socket callbacks rather than paho's threaded loop: with ``on_socket_open`` /
``on_socket_register_write`` the client's socket is watched by the event loop
(``add_reader``/``add_writer``) and ``loop_read``/``loop_write``/``loop_misc`` run on the
loop thread. Every paho callback (CONNACK, PUBACK, PUBLISH) then runs on the loop
thread, so futures are resolved without locks or thread hops, and an acknowledgement
is written exactly when the coroutine that committed the message calls :meth:`ack` —
no window where a network thread acts on a message the loop has not seen. Only the
blocking TCP/TLS connect runs in an executor; the socket callbacks it triggers hop to
the loop with ``call_soon_threadsafe``.

One paho client lives for the whole process and is reconnected, so its MQTT session
state (packet ids, QoS 2 handshakes in flight) stays in step with the broker's
persistent session (clean start off; MQTT 5 session expiry).

About 600 lines on purpose: the socket callbacks, the reconnect loop, the subscription
bookkeeping and the in-flight publish/ack bookkeeping share that one client's state;
split, each part would reach into the others' private fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties, VariableByteIntegers
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from gateway.secrets import SecretError
from plugins.mqtt.config import MqttConfig, TlsConfig

log = logging.getLogger(__name__)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark ``fut``'s exception as retrieved (a failure already reported otherwise)."""
    if not fut.cancelled():
        fut.exception()
paho_log = logging.getLogger(f"{__name__}.paho")

#: paho log level -> logging level (what ``enable_logger`` would use).
_PAHO_LEVELS: dict[int, int] = {int(k): v for k, v in paho.LOGGING_LEVEL.items()}


class PahoClient(paho.Client):
    """paho's client without two costs per message that buy the gateway nothing
    (issue 16; measured in docs/performance.md, "Latency budget and client costs"):

    - after every PUBACK/PUBCOMP paho scans all messages it holds for a queued one to
      send next (O(n) per acknowledgement, O(n^2) per batch in flight); there is none
      while every message it holds is in flight (QoS 0 ones are never held; a
      reconnect recounts), so the scan is skipped then; whoever drops held messages
      must lower ``_inflight_messages`` as paho does (``_forget_unacknowledged``);
    - paho formats each DEBUG line (``Sending PUBLISH ... properties=[...]``) before
      handing it to ``on_log``; it is skipped unless this module's paho logger is
      enabled for DEBUG (``mqgw -vv run``), so nothing that is logged today is lost.

    It also turns Nagle's algorithm off (:func:`set_no_delay`) and writes packets queued
    together under TCP_CORK, so they still leave in full segments.

    All of them override paho internals (paho-mqtt 2.1/2.2: ``_update_inflight``,
    ``_easy_log``, ``_create_socket_connection``, ``_packet_write``, ``_out_packet``,
    ``_sock``); tests/plugins/mqtt/test_mqtt_paho_client.py fails if a paho release
    changes what they rely on.
    """

    def _update_inflight(self) -> MQTTErrorCode:
        if self._inflight_messages >= len(self._out_messages):
            return MQTTErrorCode.MQTT_ERR_SUCCESS  # nothing queued behind the window
        result: MQTTErrorCode = super()._update_inflight()
        return result

    def _easy_log(self, level: Any, fmt: str, *args: Any) -> None:
        if level == paho.MQTT_LOG_DEBUG and not paho_log.isEnabledFor(logging.DEBUG):
            return
        super()._easy_log(level, fmt, *args)

    def _create_socket_connection(self) -> socket.socket:
        sock: socket.socket = super()._create_socket_connection()
        set_no_delay(sock)
        return sock

    def _packet_write(self) -> MQTTErrorCode:
        # Several packets queued (a batch's PUBLISHes, a PUBACK and the reply it
        # answers): corked, so that without Nagle they still leave in full segments,
        # sent at once when uncorked.
        sock, cork = self._sock, _TCP_CORK
        if len(self._out_packet) < 2 or cork is None or not _is_tcp(sock):
            result: MQTTErrorCode = super()._packet_write()
            return result
        assert isinstance(sock, socket.socket)
        try:
            # a socket that refuses the option is written uncorked; its errors are
            # paho's to see, in the writes
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, cork, 1)
            result = super()._packet_write()
        finally:
            with contextlib.suppress(OSError):  # the connection may be gone meanwhile
                sock.setsockopt(socket.IPPROTO_TCP, cork, 0)
        return result


#: Linux's TCP_CORK (None elsewhere: packets are then written as they are).
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)


def _is_tcp(sock: object) -> bool:
    """A TCP socket (or TLS over one); not paho's ``unix`` or ``websockets`` wrappers."""
    return isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6)


def set_no_delay(sock: socket.socket) -> None:
    """TCP_NODELAY on a client socket (paho leaves Nagle's algorithm on). With Nagle a
    small packet written while an earlier one is unacknowledged (a PUBLISH right after
    the PUBACK of the message it answers) waits for the broker's delayed ACK, about
    40 ms on Linux: that was most of a request/reply round trip through MQTT
    (docs/performance.md, "Nagle's algorithm on the MQTT socket"). Packets queued
    together are corked instead (``PahoClient._packet_write``)."""
    if _is_tcp(sock):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


#: paho's Message Expiry Interval etc. live in Properties objects per packet type.
MISC_INTERVAL = 1.0


class MqttConnectionError(ConnectionError):
    """The broker connection is down or refused a request (``reason``: MQTT reason;
    ``kind``: ``tls``, ``auth``, ``connect`` or ``refused``, for counters;
    ``retriable``: whether trying again later can succeed)."""

    def __init__(
        self,
        message: str,
        reason: int = 0,
        *,
        kind: str = "connect",
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.kind = kind
        self.retriable = reason == 0 if retriable is None else retriable


#: CONNACK reasons (MQTT 5 numbering; paho maps 3.1.1 return codes onto them) that an
#: operator fixes outside the gateway (credentials, ACLs, broker load): retried with
#: backoff, since a password file or a broker account may change while we wait.
RETRIABLE_REFUSALS = frozenset({0x80, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x97, 0x9F})
#: ... and those among them that are about who we are.
AUTH_REFUSALS = frozenset({0x86, 0x87, 0x8A, 0x8C})

#: OpenSSL verify codes meaning "the chain does not end at a CA we trust" (18-21).
UNTRUSTED_ISSUER = frozenset({18, 19, 20, 21})
_SSL_NOISE = re.compile(r"^\[[A-Z0-9_: ]+\]\s*|\s*\(_ssl\.c:\d+\)$")


def ssl_cause(exc: BaseException | str) -> str:
    """The readable part of an ``ssl`` error: ``certificate has expired`` rather than
    ``[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ... (_ssl.c:1006)``."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        if exc.verify_code in UNTRUSTED_ISSUER:
            return f"{exc.verify_message} (no CA in tls.ca_file signed the broker's certificate)"
        return str(exc.verify_message)
    # SSLError args: (errno, "[SSL: CODE] text (_ssl.c:NNN)"); paho's log: that text.
    text = str(exc.args[1] if isinstance(exc, ssl.SSLError) and exc.args[1:] else exc)
    return _SSL_NOISE.sub("", text).strip() or type(exc).__name__


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The client-side SSL context of ``tls`` (files read now). Raises
    :class:`MqttConnectionError` naming the file and the cause, never a key passphrase."""
    context = ssl.create_default_context()
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if tls.tls_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    what = "tls.ca_file"
    try:
        if tls.ca_file:
            context.load_verify_locations(cafile=tls.ca_file)
        if tls.cert_file:
            what = "tls.cert_file/tls.key_file"
            password = tls.key_password.reveal() if tls.key_password is not None else None
            # A callable, so an unencrypted key never prompts and a wrong one raises.
            context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: password or "")
    except SecretError as exc:
        raise MqttConnectionError(
            f"TLS setup failed: tls.key_password: {exc}", kind="tls", retriable=True
        ) from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, ssl.SSLError):
            detail = ssl_cause(exc)
            if "PEM lib" in str(exc) or "bad decrypt" in str(exc).lower():
                detail = (
                    "cannot read the private key (wrong or missing tls.key_password, "
                    "or not a PEM file)"
                )
        else:
            detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise MqttConnectionError(
            f"TLS setup failed: {what}: {detail}", kind="tls", retriable=True
        ) from None
    context.check_hostname = tls.check_hostname
    return context


class PublicationRefusedError(ValueError):
    """The broker refused a publication for a reason retrying cannot fix (invalid topic
    name, payload format); not retriable: the MQ unit of work backs out and the broker
    service's backout threshold parks the publication on the backout queue."""

    retriable = False

    def __init__(self, message: str, reason: int) -> None:
        super().__init__(message)
        self.reason = reason


#: MQTT 5 PUBACK/PUBREC reasons that no retry can fix (MQTT 5.0 §3.4.2.1).
PERMANENT_REFUSALS = frozenset({0x90, 0x99})


@dataclass(slots=True)
class Outgoing:
    """One message to publish."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: Sequence[tuple[str, str]] = ()
    expiry_interval: int | None = None
    utf8: bool = False
    #: MQTT 5 request/reply information (docs/mqtt-plugin.md "Request/reply").
    response_topic: str = ""
    correlation_data: bytes = b""


@dataclass(slots=True)
class Received:
    """A received message; ``generation`` names the connection it arrived on (an ack
    is only meaningful on that connection)."""

    message: paho.MQTTMessage
    generation: int


def _properties(packet_type: int) -> Properties:
    return Properties(packet_type)  # type: ignore[no-untyped-call]  # paho is untyped here


class _PackedProperties(Properties):
    """PUBLISH properties that are never changed once built, packed once: paho's own
    ``Properties`` builds its lookup tables per object and looks every property up by
    name on each ``pack`` (see :func:`publish_properties`)."""

    def pack(self) -> bytes:
        packed: bytes | None = self.__dict__.get("_packed")
        if packed is None:
            packed = super().pack()  # type: ignore[no-untyped-call]
            object.__setattr__(self, "_packed", packed)
        return packed


_PropertiesKey = tuple[str, bytes, tuple[tuple[str, str], ...], int | None, bool]
#: Distinct PUBLISH property sets seen, most recent last (bounded; shared read-only).
_PUBLISH_PROPERTIES: dict[_PropertiesKey, _PackedProperties] = {}
_PUBLISH_PROPERTIES_MAX = 256
#: A set whose packed form is longer is built per message, never cached: the cache then
#: holds at most 256 small sets (its key and value together a few KiB at worst each).
_PUBLISH_PROPERTIES_MAX_BYTES = 1024
#: paho's per-object tables (packet type, type names, property names and kinds): built
#: once, shared by every PUBLISH properties object made here (paho only reads them).
_TABLES: dict[str, Any] = {}
_INT16 = struct.Struct("!H")
_INT32 = struct.Struct("!L")


def _utf8(text: str | bytes) -> bytes:
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    return _INT16.pack(len(data)) + data


def _build_publish_properties(msg: Outgoing) -> _PackedProperties:
    """What setting each property on paho's ``Properties(PUBLISH)`` and packing it
    gives (same attributes, same bytes: MQTT 5.0 §3.3.2.3, in paho's property order),
    without its per-object tables and by-name lookups."""
    if not _TABLES:
        _TABLES.update(vars(Properties(PacketTypes.PUBLISH)))  # type: ignore[no-untyped-call]
    props = _PackedProperties.__new__(_PackedProperties)
    attrs = props.__dict__
    attrs.update(_TABLES)
    out = bytearray()
    if msg.utf8:
        attrs["PayloadFormatIndicator"] = 1
        out += b"\x01\x01"
    if msg.expiry_interval is not None:
        attrs["MessageExpiryInterval"] = msg.expiry_interval
        out += b"\x02" + _INT32.pack(msg.expiry_interval)
    if msg.response_topic:
        attrs["ResponseTopic"] = msg.response_topic
        out += b"\x08" + _utf8(msg.response_topic)
    if msg.correlation_data:
        attrs["CorrelationData"] = msg.correlation_data
        out += b"\x09" + _INT16.pack(len(msg.correlation_data)) + msg.correlation_data
    if msg.user_properties:
        pairs = list(msg.user_properties)
        attrs["UserProperty"] = pairs
        for name, value in pairs:
            out += b"\x26" + _utf8(name) + _utf8(value)
    attrs["_packed"] = VariableByteIntegers.encode(len(out)) + bytes(out)  # type: ignore[no-untyped-call]
    return props


def publish_properties(msg: Outgoing) -> Properties | None:
    """The MQTT 5 PUBLISH properties of ``msg`` (None: it has none), packed when built
    and shared by equal sets (bounded cache, by count and by each set's size: a large
    set is built per message): paho only packs them (also to resend)."""
    if not (
        msg.user_properties
        or msg.expiry_interval is not None
        or msg.utf8
        or msg.response_topic
        or msg.correlation_data
    ):
        return None
    key: _PropertiesKey | None = (
        msg.response_topic,
        msg.correlation_data,
        tuple(msg.user_properties),
        msg.expiry_interval,
        msg.utf8,
    )
    props: _PackedProperties | None = None
    try:
        props = _PUBLISH_PROPERTIES.get(key)  # type: ignore[arg-type]  # not None here
    except TypeError:  # pairs given as lists: not hashable, built uncached
        key = None
    if props is not None:
        return props
    props = _build_publish_properties(msg)
    if key is None or len(props.pack()) > _PUBLISH_PROPERTIES_MAX_BYTES:
        return props
    if len(_PUBLISH_PROPERTIES) >= _PUBLISH_PROPERTIES_MAX:
        del _PUBLISH_PROPERTIES[next(iter(_PUBLISH_PROPERTIES))]
    _PUBLISH_PROPERTIES[key] = props
    return props


def jittered_delay(attempt: int, low: float, high: float) -> float:
    """Full-jitter exponential backoff: uniform in [low, min(high, low * 2**attempt)]."""
    cap = min(high, low * (2 ** min(attempt, 30)))
    return random.uniform(low, max(low, cap))


class MqttConnection:
    """A reconnecting MQTT client on the running event loop (see module docstring)."""

    def __init__(
        self,
        config: MqttConfig,
        client_id: str,
        *,
        on_message: Callable[[Received], None],
        subscriptions: Callable[[], Sequence[tuple[str, int]]],
        client_factory: Callable[..., paho.Client] = PahoClient,
        name: str = "",
        on_failure: Callable[[MqttConnectionError], None] | None = None,
    ) -> None:
        self.config = config
        #: How log lines name this connection: ``mqtt plugin 'NAME'``.
        self.label = f"mqtt plugin {name!r}" if name else f"mqtt client {client_id!r}"
        #: Told about every failed connection attempt (the instance counts them).
        self._on_failure = on_failure
        #: The socket error paho met while a connection was being set up (TLS alerts
        #: after the handshake, such as "certificate required", arrive as read errors).
        self._read_error = ""
        self._tls_ready = False
        #: Builds the paho client (tests pass a paho.Client subclass that records acks).
        self._client_factory = client_factory
        self.client_id = client_id
        self._on_message = on_message
        self._subscriptions = subscriptions
        self.v5 = config.protocol == "5"
        self._loop = asyncio.get_running_loop()
        self._client = self._make_client()
        self._connected = asyncio.Event()
        self._connack: asyncio.Future[tuple[bool, int, str]] | None = None
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._sub_pending: dict[int, asyncio.Future[list[int]]] = {}
        self._generation = 0
        #: CONNACK received and socket not lost (``connected`` also needs SUBACK)
        self._link_up = False
        self._subscribed_once = False
        #: subscriptions the broker granted in the current session (what a session that
        #: survived a reconnect already holds)
        self._granted: set[tuple[str, int]] = set()
        self._closing = False
        self._misc_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._fd = -1
        self._connecting = False
        self._loop_thread = threading.get_ident()
        self.last_error = ""

    # ------------------------------------------------------------------ set-up -----

    def _make_client(self) -> paho.Client:
        cfg = self.config
        client = self._client_factory(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if self.v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if self.v5 else False,
            manual_ack=True,
            reconnect_on_failure=False,
        )
        client.on_log = self._paho_log
        client.max_inflight_messages_set(cfg.max_inflight)
        client.max_queued_messages_set(0)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_publish = self._handle_publish
        client.on_subscribe = self._handle_subscribe
        client.on_message = self._handle_message
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._register_write
        client.on_socket_unregister_write = self._unregister_write
        return client

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def generation(self) -> int:
        return self._generation

    async def start(self) -> None:
        """Connect once (raising :class:`MqttConnectionError` when that fails), then keep
        the connection up in the background. A failed start leaves nothing behind (no
        socket, no task)."""
        self._misc_task = asyncio.create_task(self._misc_loop(), name=f"mqtt-misc-{self.client_id}")
        try:
            await self._connect_once()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Disconnect cleanly (the broker keeps the session: it is not a clean start)."""
        self._closing = True
        for task in (self._reconnect_task, self._misc_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._link_up:
            self._client.disconnect()
            with contextlib.suppress(Exception):
                self._client.loop_write()
        self._close_socket()
        self._connected.clear()
        self._fail_pending(MqttConnectionError("the connection was closed"))

    # --------------------------------------------------------------- connecting -----

    async def _connect_once(self) -> None:
        try:
            await self._try_connect()
        except MqttConnectionError as exc:
            if self._on_failure is not None:
                self._on_failure(exc)
            raise

    def _prepare_security(self) -> None:
        """TLS context (once: paho keeps it; a failure is retried) and credentials
        (every attempt: a rotated password file takes effect on the next connect)."""
        cfg = self.config
        if cfg.tls is not None and not self._tls_ready:
            self._client.tls_set_context(tls_context(cfg.tls))
            self._tls_ready = True
        if cfg.username is not None:
            try:
                password = cfg.password.reveal() if cfg.password is not None else None
            except SecretError as exc:
                raise MqttConnectionError(
                    f"cannot read the password: {exc}", kind="auth", retriable=True
                ) from None
            self._client.username_pw_set(cfg.username, password)

    def _server(self) -> str:
        return f"server {self.config.host}:{self.config.port}"

    async def _try_connect(self) -> None:
        cfg = self.config
        try:
            self._prepare_security()
        except MqttConnectionError as exc:
            self.last_error = str(exc)
            raise
        self._read_error = ""
        props: Properties | None = None
        if self.v5:
            props = _properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = cfg.session_expiry
            props.ReceiveMaximum = cfg.inbound.receive_maximum
        self._connack = self._loop.create_future()
        try:
            self._connecting = True  # paho is in the executor: the loop leaves it alone
            try:
                await asyncio.wait_for(
                    self._loop.run_in_executor(None, self._blocking_connect, props),
                    cfg.connect_timeout,
                )
            finally:
                self._connecting = False
            session_present, rc, why = await asyncio.wait_for(self._connack, cfg.connect_timeout)
        except ssl.SSLError as exc:
            self._close_socket()
            self.last_error = f"TLS handshake failed: {ssl_cause(exc)} ({self._server()})"
            raise MqttConnectionError(self.last_error, kind="tls") from None
        except MqttConnectionError as exc:
            # The link dropped before CONNACK: with TLS, usually the broker refusing our
            # certificate (an alert after the handshake) - paho saw it as a read error.
            self._close_socket()
            if self._read_error and cfg.tls is not None:
                self.last_error = (
                    f"TLS handshake failed: the broker closed the connection: "
                    f"{ssl_cause(self._read_error)} ({self._server()})"
                )
                raise MqttConnectionError(self.last_error, kind="tls") from None
            self.last_error = f"{self._server()} closed the connection before CONNACK: {exc}"
            raise MqttConnectionError(self.last_error) from None
        except (OSError, TimeoutError, ValueError) as exc:
            self._close_socket()
            self.last_error = (
                f"cannot connect to {cfg.host}:{cfg.port}: {exc or type(exc).__name__}"
            )
            raise MqttConnectionError(self.last_error) from exc
        finally:
            self._connack = None
        if rc != 0:
            self._close_socket()
            user = f"user {cfg.username!r}, " if cfg.username is not None else "no user name, "
            self.last_error = (
                f"the broker refused the connection: {why} (0x{rc:02X}) ({user}{self._server()})"
            )
            raise MqttConnectionError(
                self.last_error,
                rc,
                kind="auth" if rc in AUTH_REFUSALS else "refused",
                retriable=rc in RETRIABLE_REFUSALS,
            )
        try:
            await self._subscribe_all(session_present)
        except TimeoutError as exc:
            self._link_up = False
            self._close_socket()
            self.last_error = f"{cfg.host}:{cfg.port} did not answer SUBSCRIBE (no SUBACK)"
            raise MqttConnectionError(self.last_error) from exc
        except MqttConnectionError as exc:
            self._link_up = False
            self._close_socket()
            self.last_error = str(exc)
            raise
        self._connected.set()
        self.last_error = ""

    def _blocking_connect(self, props: Properties | None) -> None:
        cfg = self.config
        if self.v5:
            self._client.connect(
                cfg.host, cfg.port, cfg.keepalive, clean_start=False, properties=props
            )
        else:
            self._client.connect(cfg.host, cfg.port, cfg.keepalive)

    async def _subscribe_all(self, session_present: bool) -> None:
        """Subscribe on the first connection of this process (the config may have
        changed) and whenever the broker lost our session; otherwise the session has
        the subscriptions and the unacknowledged messages already."""
        subs = list(dict.fromkeys(self._subscriptions()))
        if session_present and self._subscribed_once:
            # The session has them, except those added since (``subscribe_added``)
            # that never reached the broker.
            subs = [s for s in subs if s not in self._granted]
        else:
            self._granted.clear()
        if subs:
            await self._subscribe(subs)
        self._subscribed_once = True
        # Sources added while that SUBSCRIBE was in flight (``subscribe_added`` sends
        # nothing until the connection counts as up).
        while added := [s for s in dict.fromkeys(self._subscriptions()) if s not in self._granted]:
            await self._subscribe(added)

    async def subscribe_added(self) -> None:
        """Subscribe now to what :attr:`subscriptions` gained since the last SUBSCRIBE
        (request/reply sources added at run time). While disconnected nothing is sent:
        the next connection subscribes them. Raises :class:`MqttConnectionError` when
        the broker refuses one."""
        if not self._connected.is_set():
            return
        subs = [s for s in dict.fromkeys(self._subscriptions()) if s not in self._granted]
        if subs:
            await self._subscribe(subs)

    async def _subscribe(self, subs: list[tuple[str, int]]) -> None:
        if self.v5:
            topics: list[tuple[str, SubscribeOptions]] = [
                (
                    topic,
                    SubscribeOptions(
                        qos=qos,
                        noLocal=True,
                        retainAsPublished=True,
                        retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB,
                    ),
                )
                for topic, qos in subs
            ]
            rc, mid = self._client.subscribe(topics)
        else:
            rc, mid = self._client.subscribe(list(subs))
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or mid is None:
            raise MqttConnectionError(f"SUBSCRIBE could not be sent ({paho.error_string(rc)})")
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        self._sub_pending[mid] = fut
        try:
            granted = await asyncio.wait_for(fut, self.config.connect_timeout)
        finally:
            self._sub_pending.pop(mid, None)
        refused = [
            (topic, code) for (topic, _), code in zip(subs, granted, strict=False) if code >= 0x80
        ]
        if refused:
            # A SUBACK failure code (0x80 and up: not authorised, bad filter, ...) is a
            # config or ACL problem: retrying the same SUBSCRIBE will not help.
            raise MqttConnectionError(
                "the broker refused the subscriptions "
                + ", ".join(f"{topic!r} (reason 0x{code:02X})" for topic, code in refused),
                refused[0][1],
                kind="refused",
            )
        self._granted.update(subs)

    def _schedule_reconnect(self) -> None:
        if self._closing or (self._reconnect_task and not self._reconnect_task.done()):
            return
        self._reconnect_task = asyncio.create_task(
            self._reconnect_loop(), name=f"mqtt-reconnect-{self.client_id}"
        )

    async def _reconnect_loop(self) -> None:
        attempt = 0
        while not self._closing and not self.connected:
            delay = jittered_delay(
                attempt, self.config.reconnect_min_delay, self.config.reconnect_max_delay
            )
            await asyncio.sleep(delay)
            attempt += 1
            try:
                await self._connect_once()
            except MqttConnectionError as exc:
                log.warning("%s: reconnect attempt %d failed: %s", self.label, attempt, exc)
            else:
                log.info(
                    "%s: connection to %s:%d re-established",
                    self.label,
                    self.config.host,
                    self.config.port,
                )

    # ------------------------------------------------------------------ traffic -----

    async def publish_all(self, messages: Sequence[Outgoing], timeout: float) -> None:
        """Publish ``messages`` in order (pipelined) and return once every one is
        acknowledged (PUBACK/PUBCOMP; QoS 0: written to the socket)."""
        if not self.connected:
            raise MqttConnectionError(self.last_error or "not connected to the MQTT broker")
        futures: list[asyncio.Future[None]] = []
        v5 = self.v5
        publish = self._client.publish
        for msg in messages:
            props = publish_properties(msg) if v5 else None
            info = publish(msg.topic, msg.payload, qos=msg.qos, retain=msg.retain, properties=props)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                raise MqttConnectionError(f"publish failed: {paho.error_string(info.rc)}")
            fut: asyncio.Future[None] = self._loop.create_future()
            self._pending[info.mid] = fut
            futures.append(fut)
        try:
            async with asyncio.timeout(timeout):
                # in order, not gather: acknowledgements come together, and gather's
                # callback per future cost a microsecond a message; cancelled (the
                # timeout), every future is, as gather's would be
                try:
                    for fut in futures:
                        await fut
                except asyncio.CancelledError:
                    for fut in futures:
                        fut.cancel()
                    raise
                except BaseException:
                    # the later futures' own failures are known already (as gather
                    # would have it): no "exception never retrieved" for them
                    for fut in futures:
                        fut.add_done_callback(_retrieved)
                    raise
        except TimeoutError as exc:
            raise MqttConnectionError(
                f"{sum(not f.done() for f in futures)} of {len(futures)} messages not "
                f"acknowledged within {timeout} s"
            ) from exc

    def ack(self, received: Received) -> bool:
        """Acknowledge a QoS 1/2 message (PUBACK/PUBCOMP); False when not sent.

        QoS 1 is acknowledged only on the connection it arrived on (otherwise the broker
        redelivers it). QoS 2 is acknowledged on the current link whatever it arrived
        on: paho delivered it after PUBREL, so the broker will not resend the PUBLISH,
        only PUBREL again (which paho leaves to us under manual_ack), until PUBCOMP."""
        msg = received.message
        if msg.qos == 0:
            return True
        if not self._link_up:
            return False
        if msg.qos == 1 and received.generation != self._generation:
            return False
        rc = self._client.ack(msg.mid, msg.qos)
        return rc == MQTTErrorCode.MQTT_ERR_SUCCESS

    # ---------------------------------------------------------- paho callbacks -----

    def _handle_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if not reason.is_failure:
            # A new connection: messages from here on are acknowledged on it (the broker
            # may resend unacknowledged ones right behind the CONNACK).
            self._generation += 1
            self._link_up = True
        if self._connack is not None and not self._connack.done():
            self._connack.set_result((bool(flags.session_present), int(reason.value), str(reason)))

    def _handle_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        was_connected = self.connected
        self._connected.clear()
        self._link_up = False
        self._drop_socket()
        self.last_error = f"disconnected from the MQTT broker ({reason})"
        self._forget_unacknowledged(set(self._pending))
        self._fail_pending(MqttConnectionError(self.last_error, int(reason.value)))
        if was_connected and not self._closing:
            log.warning("%s: %s; reconnecting", self.label, self.last_error)
            self._schedule_reconnect()

    def _handle_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        fut = self._pending.pop(mid, None)
        if fut is None or fut.done():
            return
        if reason.is_failure:
            text = f"the broker refused a publication: {reason} (0x{reason.value:02X})"
            exc: Exception = (
                PublicationRefusedError(text, reason.value)
                if reason.value in PERMANENT_REFUSALS
                else MqttConnectionError(text, reason.value)
            )
            fut.set_exception(exc)
        else:
            fut.set_result(None)

    def _handle_subscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        fut = self._sub_pending.get(mid)
        if fut is not None and not fut.done():
            fut.set_result([int(rc.value) for rc in reason_codes])

    def _paho_log(self, client: paho.Client, userdata: Any, level: int, text: str) -> None:
        """paho's log, at DEBUG for socket errors while connecting: the failed attempt
        is reported once, with its cause, by :meth:`_try_connect`."""
        if not self._link_up and text.startswith(("failed to receive on socket", "timeout on")):
            self._read_error = text.split(": ", 1)[-1]
            paho_log.debug("%s", text)
            return
        paho_log.log(_PAHO_LEVELS.get(level, logging.DEBUG), "%s", text)

    def _handle_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        self._on_message(Received(msg, self._generation))

    def _forget_unacknowledged(self, mids: set[int]) -> None:
        """Drop QoS 0/1 publications whose ``send`` is about to fail from paho's resend
        queue: the MQ unit of work backs out and offers them again, so a resend by paho
        after reconnecting would be one more copy. QoS 2 ones stay: their handshake
        state is shared with the broker's session and must complete."""
        out: Any = getattr(self._client, "_out_messages", None)
        if out is None or not mids:
            return
        for mid in [m for m, msg in list(out.items()) if m in mids and msg.qos < 2]:
            msg = out.pop(mid)
            if msg.qos > 0 and msg.state != paho.mqtt_ms_queued:
                # keep paho's in-flight count true to what it holds, as its own
                # acknowledgement handling does (PahoClient relies on it)
                self._client._inflight_messages = max(0, self._client._inflight_messages - 1)

    def _fail_pending(self, exc: Exception) -> None:
        futures: list[asyncio.Future[Any]] = [*self._pending.values(), *self._sub_pending.values()]
        self._pending.clear()
        self._sub_pending.clear()
        for fut in futures:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: no "never retrieved" warning if unawaited
        if self._connack is not None and not self._connack.done():
            self._connack.set_exception(exc)

    # ------------------------------------------------------ socket integration -----

    # Watches are keyed by file descriptor number, captured while the socket is open:
    # a closed socket's number is soon reused (by this or another client's socket), so
    # a stale reader/writer left in the selector would fire on the wrong socket.

    def _on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._loop.call_soon_threadsafe(self._watch_read, sock)

    def _socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        fd = sock.fileno()  # paho calls this before closing the socket
        if self._on_loop_thread():
            self._unwatch(fd)
        else:
            self._loop.call_soon_threadsafe(self._unwatch, fd)

    def _register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        if self._on_loop_thread():
            self._watch_write(sock)
        else:
            self._loop.call_soon_threadsafe(self._watch_write, sock)

    def _unregister_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        fd = sock.fileno()
        if self._on_loop_thread():
            self._unwatch_write(fd)
        else:
            self._loop.call_soon_threadsafe(self._unwatch_write, fd)

    def _is_current(self, sock: Any) -> bool:
        return sock.fileno() >= 0 and id(sock) == id(self._client.socket())

    def _watch_read(self, sock: Any) -> None:
        if not self._is_current(sock):
            return
        self._fd = sock.fileno()
        self._loop.add_reader(self._fd, self._do_read)

    def _watch_write(self, sock: Any) -> None:
        if not self._is_current(sock):
            return
        self._loop.add_writer(sock.fileno(), self._do_write)

    def _unwatch_write(self, fd: int) -> None:
        if fd >= 0:
            self._loop.remove_writer(fd)

    def _unwatch(self, fd: int) -> None:
        if fd < 0:
            return
        self._loop.remove_reader(fd)
        self._loop.remove_writer(fd)
        if self._fd == fd:
            self._fd = -1

    def _drop_socket(self) -> None:
        self._unwatch(self._fd)

    def _close_socket(self) -> None:
        """Unwatch and close paho's socket: paho leaves it open when a connection fails
        before or right after CONNACK, and a failed start must not leak it."""
        self._drop_socket()
        sock_close = getattr(self._client, "_sock_close", None)
        with contextlib.suppress(Exception):
            if callable(sock_close):
                sock_close()
            else:
                sock = self._client.socket()
                if sock is not None:
                    sock.close()

    def _do_read(self) -> None:
        self._client.loop_read()

    def _do_write(self) -> None:
        self._client.loop_write()
        sock = self._client.socket()
        if sock is not None and not self._client.want_write():
            self._unwatch_write(sock.fileno())

    async def _misc_loop(self) -> None:
        """Keep-alive pings and timeout detection (paho's ``loop_misc``)."""
        while True:
            await asyncio.sleep(MISC_INTERVAL)
            if not self._connecting and self._client.socket() is not None:
                self._client.loop_misc()
