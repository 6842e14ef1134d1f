"""TLS and SASL for every Kafka client of the plugin (the ``security:`` config block).

:func:`security_args` turns the block into aiokafka keyword arguments (``security_protocol``,
an ``ssl_context`` built with :func:`ssl.create_default_context`, ``sasl_*``); ``client_args``
(plugins.kafka.sink) adds them to every producer, consumer and admin client. Secrets are
read there, at connect time, so a rotated password file takes effect on the next connect.

:func:`preflight` opens one connection to a bootstrap server with the same settings
before the clients start: a certificate the server refuses or a SASL login the broker
refuses becomes one :class:`KafkaSecurityError` naming the instance and the cause
(aiokafka itself would only log "Unable to bootstrap" after a log line per attempt).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any, Literal

from aiokafka.errors import (
    AuthenticationFailedError,
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.secrets import Secret, SecretError
from plugins.kafka.errors import KafkaSecurityError

log = logging.getLogger(__name__)

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

#: aiokafka arguments only the ``security:`` block may set (client_options refuses them).
SECURITY_CLIENT_OPTIONS = frozenset(
    {
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "sasl_oauth_token_provider",
    }
)

#: TLS alerts of a broker that refuses the client's certificate (or its absence).
_CLIENT_CERT_ALERTS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA")
#: Longest wait for the pre-flight connection (TCP, TLS handshake, SASL exchange).
_PREFLIGHT_TIMEOUT_MS = 10_000


def _existing_file(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise ValueError(f"{value}: no such file")
    return value


class KafkaTlsConfig(BaseModel):
    """``security.tls``: how the client checks the broker and proves who it is."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    ca_file: Path | None = None
    """PEM file of the CA(s) that signed the broker's certificate; none: the system CAs."""
    cert_file: Path | None = None
    """PEM client certificate (chain) for brokers with ssl.client.auth=required."""
    key_file: Path | None = None
    """PEM private key of cert_file (may be in cert_file itself)."""
    key_password: Secret | None = None
    """Passphrase of an encrypted key_file."""
    check_hostname: bool = True
    """Check that the broker's certificate names the host connected to."""

    _files = field_validator("ca_file", "cert_file", "key_file")(_existing_file)

    @model_validator(mode="after")
    def _key_needs_cert(self) -> KafkaTlsConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file is given without cert_file")
        if self.key_password is not None and self.cert_file is None:
            raise ValueError("key_password is given without cert_file")
        return self


class KafkaSaslConfig(BaseModel):
    """``security.sasl``: the login for SASL_PLAINTEXT / SASL_SSL listeners."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mechanism: SaslMechanism = "PLAIN"
    """``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``."""
    username: str = Field(min_length=1)
    """The SASL user."""
    password: Secret
    """The SASL password, read at each connect."""


class KafkaSecurityConfig(BaseModel):
    """``security:`` of a kafka instance (docs/security.md, "Kafka: TLS and SASL")."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    protocol: SecurityProtocol = "PLAINTEXT"
    """The broker listener's protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or
    ``SASL_SSL``; ``SASL_*`` needs ``sasl``, ``tls`` goes only with ``SSL``/``SASL_SSL``."""
    tls: KafkaTlsConfig | None = None
    """TLS settings (``SSL``, ``SASL_SSL``); none: the system's CAs, hostname checked."""
    sasl: KafkaSaslConfig | None = None
    """SASL credentials (``SASL_PLAINTEXT``, ``SASL_SSL``)."""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurityConfig:
        uses_sasl = self.protocol.startswith("SASL_")
        uses_tls = self.protocol.endswith("SSL")
        if uses_sasl and self.sasl is None:
            raise ValueError(f"protocol {self.protocol} needs a sasl: block (mechanism, "
                             "username, password)")
        if not uses_sasl and self.sasl is not None:
            raise ValueError(f"sasl: is given but protocol is {self.protocol}; use "
                             "SASL_SSL (or SASL_PLAINTEXT)")
        if not uses_tls and self.tls is not None:
            raise ValueError(f"tls: is given but protocol is {self.protocol}; use SSL "
                             "or SASL_SSL")
        return self


def _reveal(secret: Secret, key: str, instance: str) -> str:
    try:
        return secret.reveal()
    except SecretError as exc:
        raise KafkaSecurityError(
            f"kafka plugin {instance!r}: cannot read security.{key}: {exc}", cause="secret"
        ) from None


def ssl_context(tls: KafkaTlsConfig | None, instance: str) -> ssl.SSLContext:
    """The client's SSLContext: verifies the broker (``ca_file`` or system CAs), checks
    its host name unless told not to, and presents the client certificate if given."""
    tls = tls or KafkaTlsConfig()
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
        context.check_hostname = tls.check_hostname
        if tls.cert_file is not None:
            password = (
                _reveal(tls.key_password, "tls.key_password", instance)
                if tls.key_password is not None
                else None
            )
            context.load_cert_chain(
                str(tls.cert_file),
                str(tls.key_file) if tls.key_file is not None else None,
                password=password,
            )
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise KafkaSecurityError(
            f"kafka plugin {instance!r}: cannot load the TLS files of security.tls "
            f"(ca_file {tls.ca_file}, cert_file {tls.cert_file}, key_file {tls.key_file}): "
            f"{reason}",
            cause="tls",
        ) from None
    return context


def security_args(security: KafkaSecurityConfig, instance: str) -> dict[str, Any]:
    """aiokafka keyword arguments for ``security`` ({} for PLAINTEXT: aiokafka's defaults)."""
    if security.protocol == "PLAINTEXT":
        return {}
    args: dict[str, Any] = {"security_protocol": security.protocol}
    if security.protocol.endswith("SSL"):
        args["ssl_context"] = ssl_context(security.tls, instance)
    if security.sasl is not None:
        args["sasl_mechanism"] = security.sasl.mechanism
        args["sasl_plain_username"] = security.sasl.username
        args["sasl_plain_password"] = _reveal(security.sasl.password, "sasl.password", instance)
    return args


def _servers(bootstrap: str | list[str]) -> list[tuple[str, int]]:
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out: list[tuple[str, int]] = []
    for item in items:
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "9092"
        out.append((host.strip("[]"), int(port)))
    return out


def _find_cause(exc: BaseException) -> BaseException:
    """The innermost SSL or SASL error in ``exc``'s chain (or ``exc`` itself)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ssl.SSLError, AuthenticationFailedError, SaslAuthenticationFailed,
                             UnsupportedSaslMechanismError, IllegalSaslStateError)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def describe_failure(
    exc: BaseException, security: KafkaSecurityConfig, server: str
) -> tuple[str, str] | None:
    """(kind, text) for a TLS or SASL failure (kind ``tls`` or ``sasl``); None for
    anything else (a refused TCP connection, a timeout: the broker is just down)."""
    cause = _find_cause(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        detail = cause.verify_message or cause.reason or str(cause)
        if "self-signed" in detail or "unable to get local issuer" in detail:
            detail += " (the broker's certificate is not signed by security.tls.ca_file)"
        elif "mismatch" in detail:
            detail += (" (connect by a name the broker's certificate lists, or set "
                       "security.tls.check_hostname: false)")
        return "tls", f"TLS handshake failed: {detail} (server {server})"
    if isinstance(cause, ssl.SSLError):
        detail = cause.reason or str(cause)
        if any(s in detail.upper() for s in _CLIENT_CERT_ALERTS):
            detail += " (the broker refused the client certificate: security.tls.cert_file)"
        return "tls", f"TLS handshake failed: {detail} (server {server})"
    if isinstance(cause, (AuthenticationFailedError, SaslAuthenticationFailed,
                          IllegalSaslStateError)):
        who = (f"user {security.sasl.username!r} with {security.sasl.mechanism}"
               if security.sasl is not None else "SASL")
        return "sasl", (f"SASL authentication failed for {who}: wrong password or unknown "
                        f"user (server {server})")
    if isinstance(cause, UnsupportedSaslMechanismError):
        return "sasl", f"SASL mechanism refused by the broker: {cause} (server {server})"
    return None


async def preflight(
    bootstrap: str | list[str], security: KafkaSecurityConfig, instance: str
) -> None:
    """Connect once to a bootstrap server with the security settings; raise
    :class:`KafkaSecurityError` when TLS or SASL is what fails. A server that is simply
    unreachable is left to the clients' own start (their errors are the usual ones)."""
    if security.protocol == "PLAINTEXT":
        return
    from aiokafka.conn import create_conn  # not part of aiokafka's typed top level

    failure: tuple[str, str] | None = None
    for host, port in _servers(bootstrap):
        args = security_args(security, instance)
        conn = None
        try:
            conn = await create_conn(
                host, port, client_id=f"mqgw-{instance}-preflight",
                request_timeout_ms=_PREFLIGHT_TIMEOUT_MS, **args
            )
            return
        except (TimeoutError, OSError, KafkaError, ValueError) as exc:
            described = describe_failure(exc, security, f"{host}:{port}")
            if described is None:
                log.debug("kafka plugin %r: pre-flight to %s:%s: %r", instance, host, port, exc)
            failure = failure or described
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
    if failure is not None:
        kind, text = failure
        raise KafkaSecurityError(f"kafka plugin {instance!r}: {text}", cause=kind)


def librdkafka_security(security: KafkaSecurityConfig, instance: str) -> dict[str, Any]:
    """The same ``security:`` block as librdkafka properties (the ``confluent`` backend):
    the CA file (or the system CAs: ``probe``), the client certificate and key, host-name
    checking (``ssl.endpoint.identification.algorithm``) and the SASL login. Secrets are
    read now, at connect time, as for aiokafka."""
    if security.protocol == "PLAINTEXT":
        return {}
    props: dict[str, Any] = {"security.protocol": security.protocol}
    if security.protocol.endswith("SSL"):
        tls = security.tls or KafkaTlsConfig()
        props["ssl.ca.location"] = str(tls.ca_file) if tls.ca_file is not None else "probe"
        props["ssl.endpoint.identification.algorithm"] = (
            "https" if tls.check_hostname else "none"
        )
        if tls.cert_file is not None:
            props["ssl.certificate.location"] = str(tls.cert_file)
            # aiokafka reads the key from cert_file when key_file is absent; so does this.
            props["ssl.key.location"] = str(tls.key_file or tls.cert_file)
            if tls.key_password is not None:
                props["ssl.key.password"] = _reveal(
                    tls.key_password, "tls.key_password", instance
                )
    if security.sasl is not None:
        props["sasl.mechanism"] = security.sasl.mechanism
        props["sasl.username"] = security.sasl.username
        props["sasl.password"] = _reveal(security.sasl.password, "sasl.password", instance)
    return props
