"""Errors of the service runtime (one root: :class:`GatewayRuntimeError`)."""

from __future__ import annotations


class GatewayRuntimeError(Exception):
    """The gateway cannot start or run as configured."""


class ConfigError(GatewayRuntimeError):
    """A configuration value is wrong. ``key`` is its dotted path (``plugins[0].config.
    bootstrap``), ``fix`` says what to write instead; both appear in the message."""

    def __init__(self, key: str, problem: str, fix: str = "", *, source: str = "") -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        self.source = source
        where = f"{source}: " if source else ""
        text = f"{where}{key or '(top level)'}: {problem}"
        if fix:
            text += f" — {fix}"
        super().__init__(text)


class ConfigErrors(GatewayRuntimeError):
    """Every problem found in one configuration file (reported together)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class PluginLoadError(GatewayRuntimeError):
    """A plugin named in the config cannot be found or loaded."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(message)
