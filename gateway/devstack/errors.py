"""Errors of the local development stack (real Kafka, Mosquitto, Spark connector jars)."""

from __future__ import annotations

from pathlib import Path


class DevstackError(Exception):
    """Root of every devstack error."""


class JarsMissingError(DevstackError):
    """The JVM jars that ``make setup`` resolves are absent or stale.

    Carries the cache directory that was looked at, so the message can say what to run.
    """

    def __init__(self, what: str, cache_dir: Path, detail: str) -> None:
        self.what = what
        self.cache_dir = cache_dir
        self.detail = detail
        super().__init__(f"{what} jars not usable in {cache_dir}: {detail} (run `make setup`)")


class ExecutableNotFoundError(DevstackError):
    """A program the devstack runs (java, mosquitto) is not installed."""

    def __init__(self, program: str, searched: list[str], hint: str) -> None:
        self.program = program
        self.searched = searched
        self.hint = hint
        super().__init__(f"{program} not found (searched: {', '.join(searched)}); {hint}")


class ServiceStartError(DevstackError):
    """A service did not become ready; carries its log file and the log's last lines."""

    def __init__(
        self, service: str, reason: str, log_path: Path | None, log_tail: str, exit_code: int | None
    ) -> None:
        self.service = service
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail
        self.exit_code = exit_code
        where = f" (log: {log_path})" if log_path is not None else ""
        text = f"{service} failed to start: {reason}{where}"
        if log_tail:
            text += f"\n--- last lines of the {service} log ---\n{log_tail}"
        super().__init__(text)


class StateError(DevstackError):
    """The ``mqgw devstack`` state file is missing, unreadable, or describes another stack."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: {detail}")
