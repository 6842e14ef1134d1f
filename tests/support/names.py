"""Unique names for test resources (Kafka topics, MQTT client ids and topic bases) so
tests sharing one broker never see each other's data."""

from __future__ import annotations

import uuid


def unique(prefix: str) -> str:
    """``prefix`` followed by ten random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"
