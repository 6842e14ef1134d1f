"""How to reach an IBM MQ queue manager as a client, and how long to keep trying.

Why apart from the MQI code: the runtime validates this at start-up (``mqgw run``
builds it from the YAML), long before any MQI module is imported.

The password is a :class:`gateway.secrets.Secret` (``{env: NAME}``, ``{file: PATH}`` or,
for local trials, a literal string): it is read only when connecting (so a rotated file
takes effect on the next connect) and never appears in a repr, a log line or an error.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.mq.conname import format_conname, parse_conname_list
from gateway.secrets import Secret

__all__ = ["IBMMQConfig", "backoff_delays", "check_conname", "check_tls_keys"]


class IBMMQConfig(BaseModel):
    """How to reach an IBM MQ queue manager as an MQ client."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_mgr_name: str = Field(min_length=1, max_length=48)
    host: str = "127.0.0.1"
    port: int = Field(default=1414, ge=1, le=65535)
    #: A connection list, MQ's ``CONNAME('host1(port),host2(port)')`` (a port left out
    #: is 1414): the MQ client tries each in order, so it reaches whichever instance of
    #: a multi-instance or native-HA queue manager is active. Instead of host/port.
    conname: str | None = None
    #: MQCNO reconnect option: ``default`` (none set: the client's mqclient.ini or the
    #: channel's DEFRECON decide), ``disabled``, ``yes`` (MQCNO_RECONNECT: any queue
    #: manager of the list) or ``qmgr`` (MQCNO_RECONNECT_Q_MGR: only the same one).
    reconnect: Literal["default", "disabled", "yes", "qmgr"] = "default"
    channel: str = Field(default="DEV.APP.SVRCONN", min_length=1, max_length=20)
    #: MQCSP user id (connection authentication, CONNAUTH); without ``password`` an
    #: empty password is sent (as before: a queue manager without CONNAUTH checks).
    user: str | None = Field(default=None, min_length=1, max_length=1024)
    #: MQCSP password: a Secret (a plain string is accepted as a literal secret).
    password: Secret | None = None
    #: MQCD SSLCipherSpec, e.g. ``ANY_TLS12_OR_HIGHER``; set = the channel uses TLS.
    tls_cipher_spec: str | None = Field(default=None, min_length=1, max_length=32)
    #: MQSCO KeyRepository: the key database *stem* (``/var/mqm/ssl/key`` for key.kdb +
    #: key.sth); unset = the MQSSLKEYR environment variable or mqclient.ini decide.
    key_repository: str | None = Field(default=None, min_length=1, max_length=256)
    #: MQSCO KeyRepoPassword (MQ 9.3+, MQSCO version 6): the password of a PKCS#12 key
    #: repository; unset = a stash file (``key.sth``), MQKEYRPWD or mqclient.ini.
    key_repository_password: Secret | None = None
    #: MQSCO CertificateLabel: the client certificate's label in the key repository
    #: (unset = ``ibmwebspheremq<user>``, MQ's default label).
    cert_label: str | None = Field(default=None, min_length=1, max_length=64)
    connect_attempts: int = Field(default=8, ge=1)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)

    @field_validator("conname")
    @classmethod
    def _conname_list(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return format_conname(parse_conname_list(value, default_port=1414))

    @model_validator(mode="after")
    def _consistent(self) -> IBMMQConfig:
        if self.password is not None and self.user is None:
            raise ValueError("password is set but user is not: MQ sends both or neither")
        check_conname(self)
        check_tls_keys(self)
        return self

    @property
    def connection_name(self) -> str:
        """The MQCD ConnectionName: the connection list, else ``host(port)``."""
        return self.conname if self.conname is not None else f"{self.host}({self.port})"


def check_conname(config: BaseModel) -> None:
    """Refuse ``conname`` together with an explicit host or port (the runtime's YAML
    section and :class:`IBMMQConfig` share this rule)."""
    if getattr(config, "conname", None) is not None:
        both = {"host", "port"} & config.model_fields_set
        if both:
            raise ValueError(f"give conname (a connection list) or {' and '.join(sorted(both))}"
                             ", not both")


def check_tls_keys(config: object) -> None:
    """Refuse TLS keys without a cipher spec (the runtime's YAML section and
    :class:`IBMMQConfig` share this rule)."""
    if getattr(config, "tls_cipher_spec", None) is None:
        for key in ("key_repository", "key_repository_password", "cert_label"):
            if getattr(config, key, None) is not None:
                raise ValueError(
                    f"{key} is set but tls_cipher_spec is not: TLS is used only with a "
                    "cipher spec (e.g. ANY_TLS12_OR_HIGHER)"
                )


def backoff_delays(config: IBMMQConfig, rnd: random.Random | None = None) -> list[float]:
    """The waits between connection attempts: exponential, capped, full jitter."""
    r = rnd or random.Random()
    out = []
    for attempt in range(config.connect_attempts - 1):
        ceiling = min(config.backoff_max_s, config.backoff_initial_s * (2**attempt))
        out.append(r.uniform(ceiling / 2, ceiling))
    return out
