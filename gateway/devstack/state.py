"""The state file of ``mqgw devstack up``: which pids it started, on which ports.

``down`` stops exactly these processes: it checks each pid's kernel start time against
the recorded one before signalling, so a pid reused by an unrelated process is left alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NotRequired

from pydantic import BaseModel, ConfigDict, ValidationError, with_config
from typing_extensions import TypedDict

from gateway.devstack.errors import StateError
from gateway.devstack.process import ServiceProcess, adopt, pid_alive

STATE_FILE = "state.json"


@with_config(ConfigDict(use_attribute_docstrings=True))
class ServiceStatus(TypedDict):
    """One service of ``mqgw devstack status --json``."""

    name: str
    """``kafka`` or ``mqtt``."""
    address: str
    """Where it listens: ``host:port`` on 127.0.0.1."""
    pid: int
    """Its process id."""
    running: bool
    """The recorded process still runs (the same pid and start time)."""
    answering: bool
    """It answers a protocol handshake (Kafka metadata, an MQTT CONNECT)."""
    log: str
    """Its log file."""


@with_config(ConfigDict(use_attribute_docstrings=True))
class StackStatus(TypedDict):
    """What ``mqgw devstack up`` started and whether it answers (``{"running": false,
    "services": []}`` when nothing was started)."""

    running: bool
    """Every service runs and answers."""
    work_dir: NotRequired[str]
    """The stack's directory (logs, data, certificates); absent when nothing was started."""
    services: list[ServiceStatus]
    """The services ``up`` started."""


class ServiceRecord(BaseModel):
    name: str
    pid: int
    start_time: int | None
    argv: list[str]
    log_path: str
    address: str

    def process(self) -> ServiceProcess:
        return adopt(self.name, self.argv, self.pid, self.start_time, Path(self.log_path))

    def running(self) -> bool:
        return pid_alive(self.pid, self.start_time)

    @classmethod
    def of(cls, proc: ServiceProcess, address: str) -> ServiceRecord:
        return cls(
            name=proc.name,
            pid=proc.pid,
            start_time=proc.start_time,
            argv=proc.argv,
            log_path=str(proc.log_path),
            address=address,
        )


class StackState(BaseModel):
    work_dir: str
    services: list[ServiceRecord]

    def service(self, name: str) -> ServiceRecord | None:
        return next((s for s in self.services if s.name == name), None)


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def read_state(state_dir: Path) -> StackState | None:
    """The recorded stack, or ``None`` when no stack was started from ``state_dir``."""
    path = state_path(state_dir)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(path, f"cannot read: {exc}") from exc
    try:
        return StackState.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise StateError(path, f"not a devstack state file: {exc}") from exc


def write_state(state_dir: Path, state: StackState) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_path(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def clear_state(state_dir: Path) -> None:
    state_path(state_dir).unlink(missing_ok=True)
