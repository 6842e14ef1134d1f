"""``/metrics`` exports every counter the runtime keeps: among them the retained
publications a plugin refused on subscribe, plugin start errors, dead-letter failures and
a plugin's own counters (its ``stats()``, e.g. the Kafka source's commit failures)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.plugin_api import Envelope, PluginContext
from gateway.runtime.metrics import GatewayMetrics
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerService


class PlainInstance:
    """A plugin instance with no counters of its own."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def start(self, context: PluginContext) -> None:
        pass

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def healthy(self) -> bool:
        return True


class CountingInstance(PlainInstance):
    """A plugin instance that reports its own counters."""

    def stats(self) -> dict[str, int]:
        return {"inbound_commit_failures": 4, "inbound_commits": 9}


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name + "{"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def test_kept_counters_are_exported(service: BrokerService, host: PluginHost) -> None:
    host.attach(CountingInstance("k1"))
    host.sink_counters["k1"].retained_skipped = 2
    service.counters.dead_letter_failures = 5
    metrics = GatewayMetrics(service, host, lambda: {}, lambda: 3)
    text = metrics.exposition().decode()
    assert _sample(text, "mqgw_errors_total", component="k1", kind="retained_skipped") == 2
    assert _sample(text, "mqgw_errors_total", component="plugins", kind="start_error") == 3
    assert _sample(text, "mqgw_errors_total", component="broker", kind="dead_letter_failure") == 5
    assert _sample(text, "mqgw_plugin_stat", plugin="k1", stat="inbound_commit_failures") == 4
    assert _sample(text, "mqgw_plugin_stat", plugin="k1", stat="inbound_commits") == 9


def test_a_plugin_without_stats_is_left_out(service: BrokerService, host: PluginHost) -> None:
    host.attach(PlainInstance("p"))
    text = GatewayMetrics(service, host, lambda: {}).exposition().decode()
    assert _sample(text, "mqgw_plugin_stat", plugin="p") is None
    assert _sample(text, "mqgw_errors_total", component="plugins", kind="start_error") == 0
