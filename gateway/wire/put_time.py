"""MQMD PutDate/PutTime to an epoch timestamp.

Why here: the Kafka record header ``mq.putTime`` and the delivery-latency metric both
need the moment a message was put, and must agree on it. PutDate is ``YYYYMMDD`` and
PutTime ``HHMMSSTH`` (hundredths), both GMT (IBM MQ reference, MQMD PutDate/PutTime).
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["put_time_ms"]


def put_time_ms(put_date: str, put_time: str) -> int | None:
    """Milliseconds since 1970 UTC of PutDate + PutTime; None when either is absent or
    not a real date/time (e.g. month 13, blanks, non-digits)."""
    d, t = put_date.strip(), put_time.strip()
    if len(d) != 8 or len(t) not in (6, 8) or not (d + t).isascii() or not (d + t).isdigit():
        return None
    try:
        moment = datetime(
            int(d[:4]), int(d[4:6]), int(d[6:8]), int(t[:2]), int(t[2:4]), int(t[4:6]), tzinfo=UTC
        )
    except ValueError:
        return None
    hundredths = int(t[6:8]) if len(t) == 8 else 0
    return int(moment.timestamp()) * 1000 + hundredths * 10
