"""MQMD PutDate/PutTime: the one home for making and reading them.

Why here: the queue manager stamps puts, the broker stamps forwarded publications and
responses, dead-lettering stamps the MQDLH, and the Kafka header ``mq.putTime`` and the
delivery-latency metric read the stamps back; all must agree. PutDate is ``YYYYMMDD`` and
PutTime ``HHMMSSTH`` (hundredths), both GMT (IBM MQ reference, MQMD PutDate/PutTime).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["put_date_time", "put_time_ms"]


def put_date_time(now: float | datetime | None = None) -> tuple[str, str]:
    """(PutDate, PutTime) of ``now``: epoch seconds or an aware datetime; None = now."""
    if now is None or not isinstance(now, datetime):
        moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    else:
        moment = now.astimezone(UTC)
    hundredths = moment.microsecond // 10000
    second = (moment.second, moment.minute, moment.hour, moment.day, moment.month, moment.year)
    cached = _last_second
    if cached[0] != second:
        # a put stamps every message: the two strftime calls are made once per second
        cached = (second, moment.strftime("%Y%m%d"), moment.strftime("%H%M%S"))
        _set_last_second(cached)
    return cached[1], cached[2] + _HUNDREDTHS[hundredths]


#: "00" .. "99"
_HUNDREDTHS = tuple(f"{h:02d}" for h in range(100))
#: the last second formatted: ((second, minute, hour, day, month, year) in UTC, PutDate,
#: PutTime's HHMMSS)
_last_second: tuple[tuple[int, ...], str, str] = ((), "", "")


def _set_last_second(value: tuple[tuple[int, ...], str, str]) -> None:
    global _last_second
    _last_second = value


def put_time_ms(put_date: str, put_time: str) -> int | None:
    """Milliseconds since 1970 UTC of PutDate + PutTime; None when either is absent or
    not a real date/time (e.g. month 13, blanks, non-digits)."""
    seen = _last_read
    if seen[1] == put_time and seen[0] == put_date:
        return seen[2]  # a batch of one publisher's messages: the same stamp again
    ms = _read_put_time_ms(put_date, put_time)
    _set_last_read((put_date, put_time, ms))
    return ms


def _read_put_time_ms(put_date: str, put_time: str) -> int | None:
    d, t = put_date.strip(), put_time.strip()
    if len(d) != 8 or len(t) not in (6, 8) or not (d + t).isascii() or not (d + t).isdigit():
        return None
    key = d + t[:6]
    last = _last_ms
    if last[0] == key:
        base = last[1]
    else:
        try:
            moment = datetime(
                int(d[:4]), int(d[4:6]), int(d[6:8]), int(t[:2]), int(t[2:4]), int(t[4:6]),
                tzinfo=UTC,
            )
        except ValueError:
            return None
        base = int(moment.timestamp()) * 1000
        _set_last_ms((key, base))  # a stream's stamps repeat the same second
    hundredths = int(t[6:8]) if len(t) == 8 else 0
    return base + hundredths * 10


#: the last (PutDate, PutTime) asked for and its milliseconds since 1970 (or None)
_last_read: tuple[str, str, int | None] = ("", "", None)


def _set_last_read(value: tuple[str, str, int | None]) -> None:
    global _last_read
    _last_read = value


#: the last PutDate + PutTime's HHMMSS read, and its milliseconds since 1970
_last_ms: tuple[str, int] = ("", 0)


def _set_last_ms(value: tuple[str, int]) -> None:
    global _last_ms
    _last_ms = value
