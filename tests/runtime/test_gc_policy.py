"""The gateway process's garbage-collector policy (``gc:``, gateway/runtime/gc_policy.py):
thresholds raised and start-up objects frozen once started, the collector never
disabled (cycles are still collected), ``tune: false`` honoured, Python's settings back
after release, clear config errors, ``mqgw run --check`` accepting the section, and the
app and a worker applying it once started."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.runtime import gc_policy
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors
from gateway.runtime.gc_policy import DEFAULT_GEN0_THRESHOLD, GcConfig, apply_gc_policy
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.workers import child
from gateway.runtime.workers.spec import PluginSpec, WorkerSpec
from plugins.memory import reset_buses


@pytest.fixture(autouse=True)
def python_settings() -> Iterator[tuple[int, int, int]]:
    """Each test starts from, and must end with, the process's own settings."""
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert gc_policy._holders == 0
    yield before
    assert gc.get_threshold() == before
    # no more than before: a frozen object freed meanwhile lowers the count
    assert gc.get_freeze_count() <= frozen
    assert gc.isenabled()
    assert gc_policy._holders == 0


def test_thresholds_raised_start_up_frozen_and_released(
    python_settings: tuple[int, int, int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.runtime.gc_policy")
    frozen_before = gc.get_freeze_count()
    policy = apply_gc_policy(GcConfig(gen0_threshold=12_345), who="gateway t")
    try:
        assert gc.get_threshold() == (12_345, *python_settings[1:])
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen_before  # the start-up objects
        assert policy.applied and policy.frozen >= gc.get_freeze_count()  # some die since
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and lines[0].startswith("gateway t: garbage collector: ")
        assert "frozen" in lines[0] and "12345" in lines[0]
    finally:
        policy.release()
    assert gc.get_threshold() == python_settings
    policy.release()  # a second release changes nothing
    assert gc.get_threshold() == python_settings


def test_the_default_is_the_measured_threshold_with_a_freeze() -> None:
    cfg = GcConfig()
    assert cfg.tune and cfg.freeze_after_start
    assert cfg.gen0_threshold == DEFAULT_GEN0_THRESHOLD == 20_000


def test_freeze_is_called_once_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gc_policy.gc, "freeze", lambda: calls.append("freeze"))
    policy = apply_gc_policy(GcConfig())
    policy.release()
    assert calls == ["freeze"]
    calls.clear()
    policy = apply_gc_policy(GcConfig(freeze_after_start=False, gen0_threshold=5_000))
    try:
        assert gc.get_threshold()[0] == 5_000
    finally:
        policy.release()
    assert calls == []


def test_tune_false_leaves_python_settings_alone(
    python_settings: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.runtime.gc_policy")
    calls: list[object] = []
    monkeypatch.setattr(gc_policy.gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc_policy.gc, "set_threshold", lambda *a: calls.append(a))
    policy = apply_gc_policy(GcConfig(tune=False, gen0_threshold=50_000))
    assert not policy.applied and calls == []
    assert gc.get_threshold() == python_settings
    assert "Python's defaults kept (gc.tune: false)" in caplog.records[0].getMessage()
    policy.release()
    assert calls == []


def test_two_gateways_in_one_process_restore_once_the_last_stops(
    python_settings: tuple[int, int, int],
) -> None:
    first = apply_gc_policy(GcConfig(gen0_threshold=10_000))
    second = apply_gc_policy(GcConfig(gen0_threshold=30_000))
    assert gc.get_threshold()[0] == 30_000
    first.release()
    assert gc.get_threshold()[0] == 30_000  # the second still runs
    assert gc.get_freeze_count() > 0
    second.release()
    assert gc.get_threshold() == python_settings


def test_cycles_are_still_collected_under_the_policy() -> None:
    """A raised threshold delays cyclic garbage, never keeps it: once the allocations
    pass the threshold, the young collection frees the cycle without gc.collect()."""
    policy = apply_gc_policy(GcConfig())  # 20,000
    try:
        class Node:
            def __init__(self) -> None:
                self.other: Node | None = None

        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # cyclic: reference counting alone cannot free it
        held = [[] for _ in range(DEFAULT_GEN0_THRESHOLD + 1_000)]  # net allocations
        assert gone() is None
        del held
    finally:
        policy.release()


@pytest.mark.parametrize(
    ("section", "key", "words"),
    [
        ({"gen0_threshold": 0}, "gc.gen0_threshold", "0 would stop automatic collection"),
        ({"gen0_threshold": 100}, "gc.gen0_threshold", "outside 700...1,000,000"),
        ({"gen0_threshold": 5_000_000}, "gc.gen0_threshold", "outside 700...1,000,000"),
        ({"gen0_threshold": "many"}, "gc.gen0_threshold", "valid integer"),
        ({"tune": "perhaps"}, "gc.tune", "valid boolean"),
        ({"freeze": True}, "gc.freeze", "known keys: tune, freeze_after_start, gen0_threshold"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(
    tmp_path: Path, section: dict[str, Any], key: str, words: str
) -> None:
    registry = PluginRegistry.from_entry_points()
    with pytest.raises(ConfigErrors) as caught:
        parse_config({"gc": section, "metrics": {"enabled": False}}, registry,
                     base_dir=tmp_path)
    text = "\n".join(str(e) for e in caught.value.errors)
    assert len(caught.value.errors) == 1, text
    assert key + ":" in text and words in text, text


def test_config_accepts_the_section_and_defaults_without_it(tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config({"gc": {"gen0_threshold": 700, "freeze_after_start": False}},
                          registry, base_dir=tmp_path)
    assert loaded.gateway.gc == GcConfig(gen0_threshold=700, freeze_after_start=False)
    assert parse_config({}, registry, base_dir=tmp_path).gateway.gc == GcConfig()


def test_mqgw_run_check_accepts_the_section(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("metrics:\n  enabled: false\ngc:\n  gen0_threshold: 30000\n"
                   "  freeze_after_start: false\n")
    run = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(cfg), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "configuration OK" in run.stdout
    effective = run.stdout.split("effective configuration", 1)[1]
    assert "gen0_threshold: 30000" in effective and "freeze_after_start: false" in effective
    bad = tmp_path / "bad.yaml"
    bad.write_text("gc:\n  gen0_threshold: 0\n")
    run = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(bad), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert run.returncode == 2 and "gc.gen0_threshold:" in run.stderr, run.stderr


def _app_data(gc_section: dict[str, Any]) -> dict[str, Any]:
    return {
        "broker": {"streams": [{"name": "STOCK.STREAM"}], "wait_ms": 50},
        "metrics": {"enabled": False},
        "gc": gc_section,
        "plugins": [{"name": "mem", "plugin": "memory",
                     "config": {"bus": "gcbus", "subscribe": ["$SYS/STREAM/STOCK.STREAM/#"]}}],
    }


async def test_the_app_applies_the_policy_once_started_and_releases_it(
    tmp_path: Path, python_settings: tuple[int, int, int], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset_buses()
    caplog.set_level(logging.INFO)
    started_when: list[bool] = []
    real_apply = apply_gc_policy

    def recording_apply(cfg: GcConfig, *, who: str = "gateway") -> gc_policy.GcPolicy:
        started_when.append(app.service is not None and app.host is not None
                            and app.metrics is not None and bool(app._tasks))
        return real_apply(cfg, who=who)

    monkeypatch.setattr("gateway.runtime.app.apply_gc_policy", recording_apply)
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_app_data({"gen0_threshold": 15_000}), registry,
                                  base_dir=tmp_path), registry)
    await app.start()
    try:
        assert started_when == [True]  # once, after the service and the plugins' tasks
        assert gc.get_threshold() == (15_000, *python_settings[1:])
        assert gc.get_freeze_count() > 0 and gc.isenabled()
        assert app.gc_policy is not None and app.gc_policy.applied
        lines = [r.getMessage() for r in caplog.records if "garbage collector" in r.getMessage()]
        assert lines == [f"gateway {app.config.gateway_id}: garbage collector: "
                         f"{app.gc_policy.describe()}"]
        async with asyncio.timeout(10):
            while not app.health()[0]:
                await asyncio.sleep(0.02)
    finally:
        await app.shutdown()
    assert gc.get_threshold() == python_settings


async def test_the_app_honours_tune_false(
    tmp_path: Path, python_settings: tuple[int, int, int],
) -> None:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_app_data({"tune": False}), registry, base_dir=tmp_path),
                     registry)
    frozen = gc.get_freeze_count()
    await app.start()
    try:
        assert gc.get_threshold() == python_settings
        assert gc.get_freeze_count() <= frozen  # nothing frozen (some may have died)
        assert app.gc_policy is not None and not app.gc_policy.applied
    finally:
        await app.shutdown()


def test_worker_spec_carries_the_section() -> None:
    spec = WorkerSpec(group="g", socket="/nowhere", gateway_id="gw",
                      plugins=[PluginSpec("m", "memory", {}, "BACKLOG.M")],
                      dead_letter_queue="DLQ", serviced_queues=[],
                      gc=GcConfig(gen0_threshold=9_000).model_dump())
    again = WorkerSpec.from_line(spec.to_line())
    assert GcConfig.model_validate(again.gc) == GcConfig(gen0_threshold=9_000)
    # a spec line without the key (written before it existed) means the default policy
    older = WorkerSpec.from_line(spec.to_line().replace(b',"gc":{"tune":true,'
                                                        b'"freeze_after_start":true,'
                                                        b'"gen0_threshold":9000}', b""))
    assert older.gc == {} and GcConfig.model_validate(older.gc) == GcConfig()


async def test_a_worker_applies_the_policy_once_started(
    monkeypatch: pytest.MonkeyPatch, python_settings: tuple[int, int, int],
) -> None:
    seen: list[tuple[GcConfig, str, list[str], bool]] = []
    real_apply = apply_gc_policy

    def recording_apply(cfg: GcConfig, *, who: str = "gateway") -> gc_policy.GcPolicy:
        seen.append((cfg, who, sorted(worker.forwarders), gc.isenabled()))
        policy = real_apply(cfg, who=who)
        worker.stop.set()  # started: stop at once
        return policy

    monkeypatch.setattr(child, "apply_gc_policy", recording_apply)
    spec = WorkerSpec(group="w1", socket="/nonexistent/qm.sock", gateway_id="gw",
                      plugins=[PluginSpec("m", "memory", {"bus": "gcw"}, "BACKLOG.M")],
                      dead_letter_queue="DLQ", serviced_queues=[], shutdown_timeout=2.0,
                      gc={"gen0_threshold": 25_000}, backlog_key="00" * 32)
    worker = child.Worker(spec)
    async with asyncio.timeout(20):
        await worker.run()
    assert seen == [(GcConfig(gen0_threshold=25_000), "worker w1", ["m"], True)]
    assert gc.get_threshold() == python_settings  # released when the worker stopped


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_pending_garbage_is_collected_before_the_freeze() -> None:
    """A cycle that is already garbage when the policy applies is collected first, not
    frozen until shutdown (review 19b, F6)."""
    gc.disable()  # keep the cycle uncollected until the policy's own collect
    try:
        cycle = _Cyclic()
        dead = weakref.ref(cycle)
        del cycle
        assert dead() is not None
        policy = apply_gc_policy(GcConfig())
    finally:
        gc.enable()
    try:
        assert dead() is None
    finally:
        policy.release()


def test_only_the_first_gateway_of_a_process_freezes() -> None:
    """A second gateway in the process does not freeze the first one's in-flight
    objects; its line says so; the count of the first is its own (review 19b, F7)."""
    first = apply_gc_policy(GcConfig())
    in_flight = [_Cyclic() for _ in range(100)]
    second = apply_gc_policy(GcConfig())
    try:
        assert first.frozen > 0 and second.frozen == 0
        # still in the collector's generations, so not frozen (the freeze count cannot
        # tell: a frozen object freed meanwhile, by any thread, lowers it)
        tracked = {id(o) for o in gc.get_objects()}
        assert all(id(o) in tracked for o in in_flight)
        assert "no freeze" in second.describe()
    finally:
        second.release()
        second.release()  # twice: counted once
        assert gc_policy._holders == 1
        first.release()
    del in_flight
