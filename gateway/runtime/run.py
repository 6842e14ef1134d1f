"""``mqgw run --config gateway.yaml``: the gateway as a long-running service.

Exit status: 0 after a clean stop (SIGTERM/SIGINT: drain, flush, commit), 1 when it
cannot start or a plugin cannot work with its config, 2 for an invalid config (every
problem is printed, each naming its key and the fix).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: Seconds past ``shutdown_timeout`` a stopping gateway gets before it exits anyway.
STOP_GRACE_S = 10.0


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
    p.set_defaults(func=run_command, exit_codes=(
        (0, "stopped cleanly (SIGTERM, SIGINT), or --check found the configuration valid"),
        (1, "could not start, stopped by a failure (a plugin instance that cannot start), "
            "or the stop overran shutdown_timeout + 10 s and was cut short"),
        (2, "the configuration is invalid (every problem listed)"),
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


def run_command(args: argparse.Namespace) -> int:
    from gateway.runtime.app import GatewayApp, data_paths
    from gateway.runtime.config import load_config
    from gateway.runtime.errors import ConfigErrors, GatewayRuntimeError
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

    async def main() -> int:
        app = GatewayApp(loaded, registry)
        loop = asyncio.get_running_loop()

        async def arm_on_stop() -> None:
            # Whatever asks for the stop (a signal, a fatal plugin or worker), the
            # countdown starts with it.
            await app.stop_requested.wait()
            watchdog.arm()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, app.request_stop)
        arming = loop.create_task(arm_on_stop(), name="stop watchdog")
        try:
            code = await app.run()
            watchdog.finished(code)
            return code
        finally:
            watchdog.arm()  # however run() ended, exiting is bounded too
            arming.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    try:
        return asyncio.run(main())
    except GatewayRuntimeError as exc:
        log.error("cannot start: %s", exc)
        return 1
