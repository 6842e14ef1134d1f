"""``mqgw run --config gateway.yaml``: the gateway as a long-running service.

Exit status: 0 after a clean stop (SIGTERM/SIGINT: drain, flush, commit), 1 when it
cannot start or a plugin cannot work with its config, 2 for an invalid config (every
problem is printed, each naming its key and the fix), 3 when the active instance finds
that it no longer holds the node directory's lock (it ends at once: :func:`watch_lock`).

Every run takes the node directory's lock first (gateway/runtime/instance_lock.py). With
``--multi-instance`` (IBM MQ's ``strmqm -x``) a run that finds it held waits as a standby
(gateway/runtime/standby.py) and starts as the active instance once it has it; without,
it refuses to start, as before.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.runtime.instance_lock import InstanceLock

log = logging.getLogger(__name__)

#: Seconds past ``shutdown_timeout`` a stopping gateway gets before it exits anyway.
STOP_GRACE_S = 10.0
#: How often the active instance checks that it still holds the node directory's lock
#: (:meth:`InstanceLock.still_held`): well inside an NFS lease (90 s by default).
LOCK_CHECK_S = 5.0
#: Exit status of an active instance that found its lock gone (it ends at once).
LOCK_LOST_EXIT = 3


async def watch_lock(lock: InstanceLock, interval: float = LOCK_CHECK_S) -> None:
    """Return when the lock is no longer this process's (checked every ``interval``
    seconds, off the event loop: a write and a flush of the lock file)."""
    while await asyncio.to_thread(lock.still_held):
        await asyncio.sleep(interval)


def guard_lock(lock: InstanceLock, interval: float = LOCK_CHECK_S) -> asyncio.Task[None]:
    """Check the lock for as long as the returned task runs (cancel it to stop); a lost
    lock ends the process at once (:func:`_end_at_once`)."""
    task = asyncio.get_running_loop().create_task(
        watch_lock(lock, interval), name="instance lock check")
    task.add_done_callback(lambda t: None if t.cancelled() else _end_at_once(lock.directory))
    return task


def _end_at_once(directory: Path) -> None:
    """The lock is lost: another instance may already be active on the directory, so
    this one must not write another byte there. No drain, no commit, no clean-up: what
    is uncommitted is backed out by the store, as after a crash."""
    log.critical("lost the lock on %s (the filesystem no longer lets this instance write "
                 "its lock file; on NFS: its lease expired); ending at once so that only "
                 "the instance holding the lock writes", directory)
    logging.shutdown()
    os._exit(LOCK_LOST_EXIT)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the gateway (queue manager, broker, plugins) from a config file",
        description="Run the gateway as configured in a YAML file (see examples/gateway.yaml "
        "and docs/reference/configuration.md). SIGTERM stops it cleanly.",
    )
    p.add_argument(
        "--config",
        "-c",
        type=Path,
        default=Path("gateway.yaml"),
        help="the configuration file (default: ./gateway.yaml)",
    )
    p.add_argument(
        "--check", action="store_true", help="validate the configuration, print a summary, exit"
    )
    p.add_argument(
        "-x", "--multi-instance", action="store_true",
        help="permit a standby, as IBM MQ's strmqm -x: when another instance of this node "
        "holds the data directory's lock, wait for it as a standby (/healthz answers "
        "\"standby\") and take over when that instance ends; without it such a run "
        "refuses to start, and an active instance started without it permits no standby "
        "(docs/operations.md, \"High availability\")",
    )
    p.set_defaults(func=run_command, exit_codes=(
        (0, "stopped cleanly (SIGTERM, SIGINT; also a standby stopped while waiting), or "
            "--check found the configuration valid"),
        (1, "could not start (also: another instance holds the data directory and "
            "--multi-instance was not given), stopped by a failure (a plugin instance that "
            "cannot start), or the stop overran shutdown_timeout + 10 s and was cut short"),
        (2, "the configuration is invalid (every problem listed)"),
        (3, "the active instance lost the data directory's lock (on NFS: its lease "
            "expired) and ended at once, so that only the lock's holder writes"),
    ))


def _endpoint(plugin_config: object) -> str:
    """`` -> <where it connects>`` for the --check summary (Kafka bootstrap servers, an
    MQTT host:port), so the operator sees which endpoints the variables resolved to."""
    bootstrap = getattr(plugin_config, "bootstrap_servers", None)
    if bootstrap:
        servers = bootstrap if isinstance(bootstrap, str) else ",".join(map(str, bootstrap))
        return f" -> {servers}"
    host, port = getattr(plugin_config, "host", None), getattr(plugin_config, "port", None)
    if host and port:
        return f" -> {host}:{port}"
    return ""


def _take_or_refuse(lock: InstanceLock, multi_instance: bool) -> str | None:
    """Take the node directory's lock now; None when taken or when a standby may wait,
    else why this run cannot start."""
    from gateway.runtime.instance_lock import read_holder

    try:
        if lock.try_acquire() or multi_instance:
            return None
    except OSError as exc:
        return f"cannot lock {lock.directory} ({exc.strerror})"
    holder = read_holder(lock.directory)
    who = holder.describe() if holder is not None else "another instance"
    return (f"the data directory {lock.directory} is in use by {who}; stop that instance, "
            "or start both with --multi-instance to run this one as its standby")


def run_command(args: argparse.Namespace) -> int:
    from gateway.runtime.app import GatewayApp, data_paths, node_directory
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors, GatewayRuntimeError
    from gateway.runtime.instance_lock import InstanceLock, InstanceRecord
    from gateway.runtime.logs import configure_logging
    from gateway.runtime.registry import PluginRegistry
    from gateway.runtime.stop_watchdog import StopWatchdog

    registry = PluginRegistry.from_entry_points()
    try:
        loaded = load_config(args.config, registry)
    except ConfigErrors as exc:
        print(f"mqgw run: invalid configuration ({len(exc.errors)} problem(s)):", file=sys.stderr)
        for err in exc.errors:
            print(f"  {err}", file=sys.stderr)
        return 2
    cfg = loaded.gateway
    if args.check:
        streams = ", ".join(s.name for s in cfg.broker.streams) or "(default stream only)"
        print(f"configuration OK: gateway {cfg.gateway_id}")
        print(f"  queue manager: {cfg.queue_manager.type} {cfg.queue_manager.name}")
        print(f"  stream queues: {streams}")
        for p in cfg.plugins:
            state = "" if p.enabled else " (disabled)"
            target = _endpoint(loaded.plugin_configs.get(p.name))
            print(f"  plugin instance {p.name}: {p.plugin}{state}{target}")
        for path in data_paths(loaded):
            print(f"  writes: {path}")
        from gateway.runtime.effective_config import effective_config_text

        print("effective configuration (secrets shown by their source only):")
        for line in effective_config_text(loaded).splitlines():
            print(f"  {line}")
        return 0
    verbose = int(getattr(args, "verbose", 0) or 0)
    level = "debug" if verbose >= 2 else cfg.logging.level
    configure_logging(cfg.logging.format, level)

    # The stop's own budget, then STOP_GRACE_S for what follows it (closing the stores,
    # the interpreter joining threads): past that the watchdog ends the process.
    watchdog = StopWatchdog(cfg.shutdown_timeout + STOP_GRACE_S)
    multi_instance = bool(getattr(args, "multi_instance", False))
    directory = node_directory(loaded)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        key = ("queue_manager.data_dir" if cfg.queue_manager.type == "embedded"
               else "broker.store's directory")
        log.error("cannot start: %s %s: cannot be created (%s)", key, directory, exc.strerror)
        return 1
    lock = InstanceLock(directory, InstanceRecord.of_this_process(multi_instance))
    refusal = _take_or_refuse(lock, multi_instance)
    if refusal is not None:
        log.error("cannot start: %s", refusal)
        return 1

    async def main() -> int:
        loop = asyncio.get_running_loop()
        if not lock.held:
            from gateway.runtime.standby import wait_as_standby

            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                if not await wait_as_standby(loaded, lock, stop):
                    return 0
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
        log.info("active since %s: this instance holds the lock on %s%s",
                 lock.record.describe().rpartition(" since ")[2], directory,
                 " (a standby may wait for it)" if multi_instance else "")
        app = GatewayApp(loaded, registry, lock.record)

        async def arm_on_stop() -> None:
            # Whatever asks for the stop (a signal, a fatal plugin or worker), the
            # countdown starts with it.
            await app.stop_requested.wait()
            watchdog.arm()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, app.request_stop)
        arming = loop.create_task(arm_on_stop(), name="stop watchdog")
        watching = guard_lock(lock)
        try:
            code = await app.run()
            watchdog.finished(code)
            return code
        finally:
            watchdog.arm()  # however run() ended, exiting is bounded too
            arming.cancel()
            watching.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    except GatewayRuntimeError as exc:
        log.error("cannot start: %s", exc)
        return 1
    finally:
        lock.release()
