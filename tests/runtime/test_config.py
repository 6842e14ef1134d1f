"""gateway.yaml validation: every problem reported at once, each naming its key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.runtime.config import (
    EmbeddedQueueManagerConfig,
    IBMMQQueueManagerConfig,
    load_config,
    parse_config,
)
from gateway.runtime.errors import ConfigErrors
from gateway.runtime.registry import PluginRegistry
from plugins.memory import MemoryConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


@pytest.fixture
def registry() -> PluginRegistry:
    return PluginRegistry.from_entry_points()


def _errors(data: object, registry: PluginRegistry) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        parse_config(data, registry)
    return [str(e) for e in info.value.errors]


def test_empty_file_means_embedded_defaults(registry: PluginRegistry, tmp_path: Path) -> None:
    loaded = parse_config(None, registry, base_dir=tmp_path)
    cfg = loaded.gateway
    assert isinstance(cfg.queue_manager, EmbeddedQueueManagerConfig)
    assert cfg.gateway_id == "mqgw-QM1"
    assert cfg.metrics.host == "127.0.0.1"
    assert loaded.path(cfg.broker.store) == tmp_path / "data" / "pubsub.db"


def test_example_config_is_valid(registry: PluginRegistry) -> None:
    loaded = load_config(EXAMPLE, registry)
    cfg = loaded.gateway
    assert [s.name for s in cfg.broker.streams] == ["STOCK.STREAM", "BULLETIN.STREAM"]
    assert set(loaded.plugin_configs) == {"kafka", "mqtt"}
    assert loaded.base_dir == EXAMPLE.parent


def test_typo_names_the_key_and_the_known_keys(registry: PluginRegistry) -> None:
    [msg] = _errors({"broker": {"batchsize": 10}}, registry)
    assert msg.startswith("broker.batchsize: ")
    assert "remove it or check its spelling" in msg
    assert "batch_size" in msg  # the known keys are listed


def test_all_problems_are_reported_together(registry: PluginRegistry) -> None:
    data = {
        "broker": {"batch_size": 0, "streams": [{"name": ""}]},
        "metrics": {"port": "nine"},
        "logging": {"format": "xml"},
    }
    keys = sorted(m.split(":")[0] for m in _errors(data, registry))
    assert keys == [
        "broker.batch_size",
        "broker.streams[0].name",
        "logging.format",
        "metrics.port",
    ]
    assert any("use one of 'json' or 'text'" in m for m in _errors(data, registry))


def test_plugin_sections_are_validated_by_their_plugin(registry: PluginRegistry) -> None:
    data = {
        "plugins": [
            {"name": "m1", "plugin": "memory", "config": {"subscribe": "not-a-list", "x": 1}},
            {"name": "k1", "plugin": "kafak"},
        ]
    }
    msgs = _errors(data, registry)
    assert any(m.startswith("plugins[0].config.subscribe: ") for m in msgs)
    assert any(m.startswith("plugins[0].config.x: ") and "known keys" in m for m in msgs)
    assert any(m.startswith("plugins[1].plugin: ") and "installed:" in m for m in msgs)


def test_disabled_instances_are_not_validated(registry: PluginRegistry) -> None:
    data = {"plugins": [{"name": "k", "plugin": "nonexistent", "enabled": False}]}
    assert parse_config(data, registry).plugin_configs == {}


def test_duplicate_instance_names_are_refused(registry: PluginRegistry) -> None:
    data = {"plugins": [{"name": "a", "plugin": "memory"}, {"name": "a", "plugin": "memory"}]}
    [msg] = _errors(data, registry)
    assert msg.startswith("plugins: ") and "rename one" in msg


def test_ibmmq_queue_manager_and_bad_type(registry: PluginRegistry) -> None:
    loaded = parse_config(
        {"queue_manager": {"type": "ibmmq", "name": "QM9", "password_env": "MQPW"}}, registry
    )
    assert isinstance(loaded.gateway.queue_manager, IBMMQQueueManagerConfig)
    assert loaded.gateway.gateway_id == "mqgw-QM9"
    [msg] = _errors({"queue_manager": {"type": "websphere"}}, registry)
    assert msg.startswith("queue_manager: ") and "'embedded'" in msg and "'ibmmq'" in msg


def test_environment_variables_are_expanded(
    registry: PluginRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEM_BUS", "from-env")
    data = {
        "plugins": [
            {"name": "m", "plugin": "memory", "config": {"bus": "${MEM_BUS}"}},
            {"name": "n", "plugin": "memory", "config": {"bus": "${UNSET_MQGW_VAR:-fallback}"}},
        ]
    }
    loaded = parse_config(data, registry)
    m, n = loaded.plugin_configs["m"], loaded.plugin_configs["n"]
    assert isinstance(m, MemoryConfig) and isinstance(n, MemoryConfig)
    assert (m.bus, n.bus) == ("from-env", "fallback")
    [msg] = _errors({"id": "${UNSET_MQGW_VAR}"}, registry)
    assert msg.startswith("id: ") and "export UNSET_MQGW_VAR" in msg


def test_yaml_syntax_error_names_the_line(registry: PluginRegistry, tmp_path: Path) -> None:
    bad = tmp_path / "gateway.yaml"
    bad.write_text("broker:\n  streams: [\n    - name: X\n")
    with pytest.raises(ConfigErrors) as info:
        load_config(bad, registry)
    assert "line " in str(info.value) and str(bad) in str(info.value)


def test_missing_file_says_what_to_check(registry: PluginRegistry, tmp_path: Path) -> None:
    with pytest.raises(ConfigErrors, match="check the --config path"):
        load_config(tmp_path / "nope.yaml", registry)
