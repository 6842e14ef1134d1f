"""``mqgw run --check``: request/reply routes must name enabled instances that exchange."""

from __future__ import annotations

import pytest

from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors
from gateway.runtime.registry import PluginRegistry
from plugins.memory import MemoryConfig


def _check(plugins: list[dict[str, object]], plugin: str) -> list[str]:
    data = {
        "plugins": plugins,
        "request_reply": {
            "requests": [{"name": "q", "plugin": plugin, "source": "a", "destination": "Q"}],
            "services": [{"name": "s", "queue": "S", "plugin": plugin, "target": "t",
                          "replies": "r"}],
        },
    }
    try:
        parse_config(data, PluginRegistry.from_entry_points())
    except ConfigErrors as exc:
        return [f"{e.key}: {e}" for e in exc.errors]
    return []


def test_routes_on_a_memory_instance_pass() -> None:
    assert _check([{"name": "m", "plugin": "memory"}], "m") == []


def test_route_naming_a_missing_instance_is_reported() -> None:
    problems = _check([{"name": "m", "plugin": "memory"}], "nope")
    assert len(problems) == 2
    assert problems[0].startswith("request_reply.requests[0].plugin")
    assert "not configured" in problems[0] and "m" in problems[0]


def test_route_naming_a_disabled_instance_is_reported() -> None:
    problems = _check([{"name": "m", "plugin": "memory", "enabled": False}], "m")
    assert len(problems) == 2 and "disabled" in problems[0]


@pytest.mark.parametrize("bad", [{"destination": "Q@"}, {"destination": "X" * 49}])
def test_bad_destination_is_a_config_error(bad: dict[str, str]) -> None:
    data = {"plugins": [{"name": "m", "plugin": "memory"}],
            "request_reply": {"requests": [{"name": "q", "plugin": "m", "source": "a",
                                            "destination": "Q", **bad}]}}
    with pytest.raises(ConfigErrors):
        parse_config(data, PluginRegistry.from_entry_points())


class _PubSubOnlyInstance:
    """A plugin instance with publish/subscribe only (no consume/produce)."""

    name = "p"

    async def start(self, context: object) -> None: ...
    async def send(self, envelopes: object) -> None: ...
    async def flush(self) -> None: ...
    async def stop(self) -> None: ...
    def healthy(self) -> bool:
        return True


class _PubSubOnlyPlugin:
    name = "pubsubonly"
    config_model = MemoryConfig

    def create(self, instance_name: str, config: object) -> _PubSubOnlyInstance:
        return _PubSubOnlyInstance()


def test_route_on_a_plugin_without_exchanges_is_reported() -> None:
    registry = PluginRegistry.from_entry_points(extra={"pubsubonly": _PubSubOnlyPlugin()})
    data = {"plugins": [{"name": "p", "plugin": "pubsubonly"}],
            "request_reply": {"requests": [{"name": "q", "plugin": "p", "source": "a",
                                            "destination": "Q"}]}}
    with pytest.raises(ConfigErrors) as exc:
        parse_config(data, registry)
    (problem,) = exc.value.errors
    assert problem.key == "request_reply.requests[0].plugin"
    assert "does not implement request/reply" in problem.problem
