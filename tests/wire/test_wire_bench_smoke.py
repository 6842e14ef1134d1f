"""The wire benchmark runs and its workload round-trips (figures are not asserted)."""

from __future__ import annotations

import pytest

from benchmarks import bench_wire


def test_bench_wire_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_wire.main(["--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    assert out.count("msgs/s") == 14
    assert "MQMD 364 + RFH2" in out and "payload 1024" in out
