"""Fixtures of the IBM MQ adapter tests: the stand-in MQI module over an embedded queue
manager (tests/support/mqi_standin.py), with one local queue APP.Q."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mqi_standin import StandIn


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    s = StandIn(tmp_path / "qm")
    s.qm.run_mqsc("DEFINE QLOCAL(APP.Q)")
    try:
        yield s
    finally:
        s.close()
