"""The analytics jobs, by name (``mqgw analytics <job>``)."""

from __future__ import annotations

JOB_NAMES: tuple[str, ...] = ("traffic", "latency", "lastvalue", "quality", "ohlc")
