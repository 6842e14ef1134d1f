"""Secrets in configuration: a password or token named by where it lives, never shown.

A secret is written in YAML as ``{env: NAME}`` (an environment variable), ``{file: PATH}``
(a file's contents, trailing newline stripped: Docker/Kubernetes secrets) or, for local
trials, a literal string. It is read when a connection needs it (:meth:`Secret.reveal`),
so rotating a file takes effect on the next reconnect, and its ``repr``/``str`` only name
the source: logs, metrics and ``mqgw run --check`` output never carry the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["Secret", "SecretError"]


class SecretError(Exception):
    """A configured secret cannot be read (unset variable, missing or empty file)."""


class Secret(BaseModel):
    """Where one secret value comes from: exactly one of ``env``, ``file``, ``value``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    env: str | None = Field(default=None, min_length=1)
    """The name of the environment variable holding the value."""
    file: Path | None = None
    """A file holding the value, trailing newline stripped (a Docker or Kubernetes
    secret)."""
    value: SecretStr | None = None
    """The value itself, for local trials; a plain string in YAML is this."""

    @model_validator(mode="before")
    @classmethod
    def _literal(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"value": data}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Secret:
        given = [k for k in ("env", "file", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a secret is one of {env: VARIABLE}, {file: PATH} or a literal string; "
                f"got {given or 'none'}"
            )
        return self

    @property
    def source(self) -> str:
        """Where the value comes from, safe to log: ``env NAME``, ``file PATH``, ``inline``."""
        if self.env is not None:
            return f"env {self.env}"
        if self.file is not None:
            return f"file {self.file}"
        return "inline"

    def reveal(self) -> str:
        """The value now; raises :class:`SecretError` naming the source (never the value)."""
        if self.value is not None:
            return self.value.get_secret_value()
        if self.env is not None:
            found = os.environ.get(self.env)
            if not found:
                raise SecretError(f"secret from env {self.env}: the variable is unset or empty")
            return found
        assert self.file is not None
        try:
            text = self.file.read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise SecretError(f"secret from file {self.file}: {exc.strerror or exc}") from None
        if not text:
            raise SecretError(f"secret from file {self.file}: the file is empty")
        return text

    def __repr__(self) -> str:
        return f"Secret({self.source})"

    def __str__(self) -> str:
        return f"<secret from {self.source}>"
