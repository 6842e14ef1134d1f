"""What a worker process is told at start: one JSON line on its stdin.

Why a value handed over, not the config file read again: the main process has already
validated the configuration (a test or ``mqgw run`` may not even have a file), resolved
the dead-letter queue and the backlog queue of each sink, and registered the plugins'
planned subscriptions. The worker gets exactly what it needs to forward those sinks and
nothing else; the plugin ``config:`` sections travel as the raw (environment-expanded)
mappings and are validated again by the plugin's own model in the worker. The pipe is
private to the two processes (secrets in a plugin section never reach a command line).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

#: Version of the spec; a worker refuses another (a stale interpreter after an upgrade:
#: a worker restarted from a newer installation than its running main process). Bumped
#: whenever a field is added or its meaning changes. 2: ``backlog_key`` (without it, a
#: version-1 spec would be taken and fail later, saying the key is missing).
SPEC_VERSION = 2


@dataclass(slots=True)
class PluginSpec:
    """One plugin instance the worker runs."""

    name: str
    plugin: str
    #: the raw ``config:`` section (may hold secrets: never in a repr)
    config: dict[str, Any] = field(repr=False)
    #: the backlog queue its forwarder takes deliveries from
    backlog: str
    #: (topic, scheme) the main process subscribed for it (``DeclaresSubscriptions``)
    planned: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class WorkerSpec:
    """Everything a worker process needs (see module docstring)."""

    group: str
    #: the embedded queue manager's local socket
    socket: str
    gateway_id: str
    plugins: list[PluginSpec]
    dead_letter_queue: str
    #: queues the broker service serves (inbound publications go to their stream's)
    serviced_queues: list[str]
    batch_size: int = 256
    wait_ms: int = 500
    default_backout_threshold: int = 5
    retry_delay: float = 0.5
    sink_retry_max_delay: float = 30.0
    shutdown_timeout: float = 30.0
    #: seconds between the status lines the worker writes to its stdout
    status_interval: float = 0.5
    log_format: str = "json"
    log_level: str = "info"
    #: the main process's pid: the worker stops when its parent is gone
    parent_pid: int = 0
    #: the ``gc:`` section (gateway/runtime/gc_policy.py), applied once the worker started
    gc: dict[str, Any] = field(default_factory=dict)
    #: the backlog key, hex (gateway/runtime/backlog_seal.py): the forwarders check the
    #: seal of what they get with it (a secret: never in a repr, never logged)
    backlog_key: str = field(default="", repr=False)
    version: int = SPEC_VERSION

    def to_line(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), default=str).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> WorkerSpec:
        """Parse the line; ValueError names what is wrong."""
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"worker spec is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("worker spec is not a JSON object")
        if raw.get("version") != SPEC_VERSION:
            raise ValueError(f"worker spec version {raw.get('version')!r} is not {SPEC_VERSION}")
        try:
            plugins = [
                PluginSpec(
                    p["name"], p["plugin"], dict(p["config"]), p["backlog"],
                    [(str(t), int(s)) for t, s in p.get("planned", [])],
                )
                for p in raw.pop("plugins")
            ]
            return cls(plugins=plugins, **raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"worker spec is incomplete: {exc!r}") from None
