"""One PutDate/PutTime conversion (gateway.wire.put_time) shared by the latency metric
and the envelope's ``put_time_ms`` (the Kafka ``mq.putTime`` header): both agree and both
reject impossible dates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.runtime import envelopes
from gateway.runtime.metrics import put_timestamp
from gateway.wire.put_time import put_time_ms


def test_put_time_is_milliseconds_since_epoch_in_gmt() -> None:
    expected = int(datetime(2024, 2, 29, 23, 59, 58, tzinfo=UTC).timestamp()) * 1000 + 120
    assert put_time_ms("20240229", "23595812") == expected
    assert put_time_ms("20240229", "235958") == expected - 120
    assert put_timestamp("20240229", "23595812") == expected / 1000
    assert envelopes.put_time_ms is put_time_ms


@pytest.mark.parametrize(
    ("date", "time"),
    [
        ("", ""),
        ("20241301", "12000000"),  # month 13
        ("20230229", "12000000"),  # not a leap year
        ("20240101", "25000000"),  # hour 25
        ("2024010X", "12000000"),
        ("20240101", "1200000"),  # 7 digits
    ],
)
def test_impossible_put_times_are_none_everywhere(date: str, time: str) -> None:
    assert put_time_ms(date, time) is None
    assert put_timestamp(date, time) is None
