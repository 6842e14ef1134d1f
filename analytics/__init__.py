"""PySpark analytics over the Kafka topics the gateway bridges from MQ publish/subscribe.

Runs without the gateway installed (``spark-submit`` on a cluster): nothing here imports
``gateway`` except the local runner, which asks ``gateway.devstack`` for connector jars.
The record contract these jobs read is ``docs/kafka-contract.md`` (version 1).
"""

from __future__ import annotations

__all__ = ["AnalyticsError", "__version__"]

__version__ = "0.1.0"


class AnalyticsError(Exception):
    """Root of every error the analytics package raises on purpose.

    ``job`` names the job concerned (``""`` when none), so a runner can say which one failed.
    """

    def __init__(self, message: str, *, job: str = "") -> None:
        super().__init__(message)
        self.job = job
