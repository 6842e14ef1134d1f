"""MQMD PutDate/PutTime stamps (``YYYYMMDD`` / ``HHMMSSTH``, GMT) for messages the broker
puts with all context set (forwarded publications, responses)."""

from __future__ import annotations

import time


def put_date_time(now: float | None = None) -> tuple[str, str]:
    """PutDate and PutTime of ``now`` (seconds since the epoch; the current time if None)."""
    t = time.time() if now is None else now
    tm = time.gmtime(t)
    hundredths = int((t - int(t)) * 100)
    return time.strftime("%Y%m%d", tm), time.strftime("%H%M%S", tm) + f"{hundredths:02d}"
