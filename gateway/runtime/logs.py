"""Structured logging: one JSON object per line (or classic text) on stderr.

Why JSON by default: the gateway runs as a sidecar whose logs are shipped and queried;
fields (``logger``, ``level``, anything passed in ``extra=``) must survive as fields.

Why a limiter on client libraries: during a Kafka outage aiokafka logs thousands of
lines a second (55 MB in 38 s). :class:`ThirdPartyLogLimiter` lets the first line of each
kind through (the target went down), counts the repeats, writes a summary of them at most
every ``summary_interval`` seconds, and one line when the library has been quiet for
``quiet_s`` seconds (the target is back).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | str) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


#: Loggers of client libraries whose lines are de-duplicated and rate-limited.
THIRD_PARTY_LOGGERS = ("aiokafka", "kafka", "paho", "aiomqtt")

#: Where the limiter's own summary lines go (not a limited logger: no recursion).
_REPORT = logging.getLogger("gateway.runtime.logs")


@dataclass(slots=True)
class _Incident:
    """One stretch of lines from one library, until it is quiet again."""

    started: float
    last_seen: float
    last_summary: float
    #: (logger, level, message template) -> repeats suppressed since the last summary
    kinds: dict[tuple[str, int, str], int] = field(default_factory=dict)
    suppressed_total: int = 0


class ThirdPartyLogLimiter(logging.Filter):
    """A handler filter: the first line of each kind from a client library passes, the
    repeats are counted and summarised (see module docstring). Thread-safe."""

    def __init__(
        self,
        prefixes: Sequence[str] = THIRD_PARTY_LOGGERS,
        *,
        summary_interval: float = 30.0,
        quiet_s: float = 10.0,
        kinds_per_incident: int = 10,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)
        self.summary_interval = summary_interval
        self.quiet_s = quiet_s
        self.kinds_per_incident = kinds_per_incident
        self.clock = clock
        self._incidents: dict[str, _Incident] = {}
        self._lock = threading.Lock()
        self._background = background
        self._watching = False

    def _family(self, name: str) -> str | None:
        for prefix in self.prefixes:
            if name == prefix or name.startswith(prefix + "."):
                return prefix
        return None

    def filter(self, record: logging.LogRecord) -> bool:
        family = self._family(record.name)
        if family is None:
            return True
        now = self.clock()
        summary = ""
        with self._lock:
            incident = self._incidents.get(family)
            if incident is None:
                incident = self._incidents[family] = _Incident(now, now, now)
                self._watch()
            incident.last_seen = now
            kind = (record.name, record.levelno, str(record.msg))
            if kind not in incident.kinds and len(incident.kinds) < self.kinds_per_incident:
                incident.kinds[kind] = 0
                return True
            incident.kinds[kind] = incident.kinds.get(kind, 0) + 1
            incident.suppressed_total += 1
            if now - incident.last_summary >= self.summary_interval:
                summary = self._summary(family, incident)
                incident.last_summary = now
        if summary:
            _REPORT.warning("%s", summary)
        return False

    def check(self) -> None:
        """End the incidents of libraries quiet for ``quiet_s`` (one line each); called
        every second by the watcher thread (tests call it directly)."""
        now = self.clock()
        lines: list[str] = []
        with self._lock:
            for family, incident in list(self._incidents.items()):
                if now - incident.last_seen < self.quiet_s:
                    continue
                del self._incidents[family]
                line = (
                    f"{family}: no more log lines for {self.quiet_s:.0f} s after "
                    f"{incident.last_seen - incident.started:.0f} s of trouble (target back); "
                    f"{incident.suppressed_total} repeated line(s) were suppressed"
                )
                pending = self._summary(family, incident)
                lines.append(f"{line}; {pending}" if pending else line)
        for line in lines:
            _REPORT.warning("%s", line)

    def _summary(self, family: str, incident: _Incident) -> str:
        """The repeats since the last summary, by kind (and resets them); "" if none."""
        parts = [
            f"{n} x {name} {logging.getLevelName(level)} {template!r}"
            for (name, level, template), n in incident.kinds.items()
            if n
        ]
        for kind in incident.kinds:
            incident.kinds[kind] = 0
        if not parts:
            return ""
        return f"{family}: repeated lines suppressed: " + "; ".join(parts)

    def _watch(self) -> None:
        """Start the watcher thread unless it runs (called with the lock held)."""
        if not self._background or self._watching:
            return
        self._watching = True
        threading.Thread(target=self._run, name="log-limiter", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            self.check()
            with self._lock:
                if not self._incidents:
                    self._watching = False
                    return


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Replace the root handlers with one stderr handler in ``fmt`` at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ThirdPartyLogLimiter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Client libraries are chatty at INFO (connection notices per reconnect).
    for noisy in ("aiokafka", "kafka", "paho"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
