"""IBMMQConfig: validation at the boundary, and the reconnect backoff it sets."""

from __future__ import annotations

import pytest

from gateway.mq.ibmmq import IBMMQConfig, backoff_delays


def test_backoff_is_capped_and_jittered() -> None:
    cfg = IBMMQConfig(
        q_mgr_name="STANDIN", connect_attempts=10, backoff_initial_s=1.0, backoff_max_s=8.0
    )
    a, b = backoff_delays(cfg), backoff_delays(cfg)
    assert len(a) == 9 and max(a) <= 8.0 and min(a) >= 0.5
    assert a != b


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        IBMMQConfig(q_mgr_name="")
    with pytest.raises(ValueError):
        IBMMQConfig(q_mgr_name="QM1", port=70000)
    with pytest.raises(ValueError):
        IBMMQConfig(q_mgr_name="QM1", chanel="typo")  # type: ignore[call-arg]
