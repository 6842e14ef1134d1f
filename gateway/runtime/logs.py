"""Structured logging: one JSON object per line (or classic text) on stderr.

Why JSON by default: the gateway runs as a sidecar whose logs are shipped and queried;
fields (``logger``, ``level``, anything passed in ``extra=``) must survive as fields.
"""

from __future__ import annotations

import json
import logging
import sys
import time

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


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Replace the root handlers with one stderr handler in ``fmt`` at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Client libraries are chatty at INFO (connection notices per reconnect).
    for noisy in ("aiokafka", "kafka", "paho"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
