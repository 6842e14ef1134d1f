"""How to reach an IBM MQ queue manager as a client, and how long to keep trying.

Why apart from the MQI code: the runtime validates this at start-up (``mqgw run``
builds it from the YAML), long before any MQI module is imported.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["IBMMQConfig", "backoff_delays"]


class IBMMQConfig(BaseModel):
    """How to reach an IBM MQ queue manager as an MQ client."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    q_mgr_name: str = Field(min_length=1, max_length=48)
    host: str = "127.0.0.1"
    port: int = Field(default=1414, ge=1, le=65535)
    channel: str = Field(default="DEV.APP.SVRCONN", min_length=1, max_length=20)
    user: str | None = None
    password: SecretStr | None = None
    tls_cipher_spec: str | None = None
    key_repository: str | None = None
    connect_attempts: int = Field(default=8, ge=1)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)

    @property
    def connection_name(self) -> str:
        """The MQCD ConnectionName: ``host(port)``."""
        return f"{self.host}({self.port})"


def backoff_delays(config: IBMMQConfig, rnd: random.Random | None = None) -> list[float]:
    """The waits between connection attempts: exponential, capped, full jitter."""
    r = rnd or random.Random()
    out = []
    for attempt in range(config.connect_attempts - 1):
        ceiling = min(config.backoff_max_s, config.backoff_initial_s * (2**attempt))
        out.append(r.uniform(ceiling / 2, ceiling))
    return out
