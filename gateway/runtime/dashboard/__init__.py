"""The live dashboard served next to ``/metrics`` (docs/dashboard.md).

``snapshot`` builds one typed picture of the running gateway from the state the metrics
collectors read; ``rates`` turns its counters into messages per second; ``static/``
holds the page, its style sheet and script (vanilla, vendored as package data: no build
step). The HTTP routes live in :class:`gateway.runtime.metrics.HealthServer`.
"""

from gateway.runtime.dashboard.rates import RateWindow
from gateway.runtime.dashboard.snapshot import DashboardSource, Snapshot

__all__ = ["DashboardSource", "RateWindow", "Snapshot"]
