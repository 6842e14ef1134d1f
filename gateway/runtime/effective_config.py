"""The effective configuration as ``mqgw run --check`` prints it: every key after
defaults and ``${VAR}`` expansion, every secret shown only as where it comes from.

Why a walk over the validated models rather than ``model_dump``: a dump would carry a
literal secret's value (and a plugin's raw ``config:`` mapping holds whatever the YAML
said). Here a :class:`~gateway.secrets.Secret` becomes ``<secret from env NAME>``, a
pydantic ``SecretStr`` ``<hidden>``, and a plain string under a key that names a
password, token or passphrase (a plugin that has not moved to ``Secret`` yet) ``<hidden>``
too. Plugin sections are the plugin's validated model, never the raw mapping.
"""

from __future__ import annotations

import enum
import re
from pathlib import PurePath
from typing import Any

import yaml
from pydantic import BaseModel, SecretBytes, SecretStr

from gateway.runtime.config import LoadedConfig
from gateway.secrets import Secret

__all__ = ["HIDDEN", "effective_config", "effective_config_text", "redacted"]

HIDDEN = "<hidden>"
#: Keys whose plain-string value is treated as a secret (``password_env`` names a
#: variable, ``*_file`` a path: those are shown).
_SENSITIVE = re.compile(r"(password|passphrase|passwd|secret|token|credential)", re.IGNORECASE)
_NAMES_A_SOURCE = re.compile(r"(_env|_file|_path)$", re.IGNORECASE)


def redacted(value: Any, key: str = "") -> Any:
    """``value`` as plain data (YAML-ready) with every secret replaced; ``key`` is the
    key it sits under (a plain string under a password-like key is hidden)."""
    if isinstance(value, Secret):
        return str(value)
    if isinstance(value, (SecretStr, SecretBytes)):
        return HIDDEN
    if isinstance(value, BaseModel):
        return {name: redacted(getattr(value, name), name) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {str(k): redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [redacted(v, key) for v in value]
    if isinstance(value, enum.Enum):
        return redacted(value.value, key)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return HIDDEN if _SENSITIVE.search(key) else bytes(value).hex()
    if isinstance(value, str):
        if _SENSITIVE.search(key) and not _NAMES_A_SOURCE.search(key):
            return HIDDEN
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def effective_config(loaded: LoadedConfig) -> dict[str, Any]:
    """The configuration as plain data, secrets replaced by their source."""
    out: dict[str, Any] = redacted(loaded.gateway)
    plugins = []
    for inst in loaded.gateway.plugins:
        entry: dict[str, Any] = {"name": inst.name, "plugin": inst.plugin,
                                 "enabled": inst.enabled}
        model = loaded.plugin_configs.get(inst.name)
        entry["config"] = redacted(model) if model is not None else "(disabled: not validated)"
        plugins.append(entry)
    out["plugins"] = plugins
    return out


def effective_config_text(loaded: LoadedConfig) -> str:
    """:func:`effective_config` as YAML."""
    return yaml.safe_dump(effective_config(loaded), sort_keys=False, default_flow_style=False)
