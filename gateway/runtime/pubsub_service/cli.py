"""``mqgw broker``: run the publish/subscribe service alone on an embedded queue manager
(no plugins). Also ``python -m gateway.runtime.pubsub_service.cli``.

With ``--listen``/``--mqsc`` the queue manager is a network node (listener, channels;
gateway/runtime/network_node.py). ``--profile legacy --supported-streams S1,S2`` makes it
the stand-in of a V6 message broker for tests and the demo (docs/neighbours.md): the
same engine, refusing commands on any other stream with MQRCCF_STREAM_ERROR.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.streams import (
    ADMIN_STREAM,
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
)
from gateway.runtime.neighbours.config import parse_neighbour_spec
from gateway.runtime.pubsub_service.config import BrokerConfig, StreamQueueConfig
from gateway.runtime.pubsub_service.errors import BrokerError
from gateway.runtime.pubsub_service.forgiven_backouts import ForgivenBackouts
from gateway.runtime.pubsub_service.service import BrokerService
from gateway.runtime.switch_interval import apply_switch_interval

if TYPE_CHECKING:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)

PROFILE_GATEWAY = "gateway"
PROFILE_LEGACY = "legacy"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mqgw broker``: run the publish/subscribe broker on an embedded queue manager."""
    p = subparsers.add_parser(
        "broker",
        help="run the MQ publish/subscribe broker (embedded queue manager)",
        description="Service SYSTEM.BROKER.CONTROL.QUEUE, SYSTEM.BROKER.DEFAULT.STREAM and "
        "the given stream queues of an embedded queue manager.",
    )
    add_arguments(p)
    p.set_defaults(func=run_command, exit_codes=(
        (0, "stopped by SIGINT or SIGTERM"),
        (1, "the broker failed while running"),
        (2, "an invalid setting, an unreadable or failing --mqsc file, or a --listen port "
            "that cannot be bound"),
    ))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--qmgr", required=True, help="queue manager name")
    p.add_argument("--qmgr-path", required=True, type=Path, help="embedded queue manager data")
    p.add_argument("--store", required=True, type=Path, help="subscription store (SQLite file)")
    p.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="QUEUE[:noimplicit]",
        help="serviced stream queue; ':noimplicit' turns Implicit Stream Naming off",
    )
    batch_default = BrokerConfig.model_fields["batch_size"].default
    p.add_argument("--batch-size", type=int, default=batch_default,
                   help="most messages got under one unit of work; a batch takes what is "
                   f"waiting, it never waits to fill (default {batch_default})")
    p.add_argument(
        "--neighbour",
        action="append",
        default=[],
        metavar="QM[:kind[:role[:S1,S2]]]",
        help="neighbour broker to join (kind mqpubsub|mqv7|gateway, role child|parent, "
        "streams to share); repeatable",
    )
    # ---- network node and legacy profile (issue 13; keep these together) ----
    p.add_argument(
        "--listen",
        type=int,
        metavar="PORT",
        help="channel listener port on 127.0.0.1 (0 = any free port); default: none",
    )
    p.add_argument(
        "--mqsc", type=Path, metavar="FILE", help="MQSC run at every start (channels, ...)"
    )
    p.add_argument(
        "--profile",
        choices=(PROFILE_GATEWAY, PROFILE_LEGACY),
        default=PROFILE_GATEWAY,
        help="'legacy': behave as a V6 broker supporting only --supported-streams",
    )
    p.add_argument(
        "--supported-streams",
        default="",
        metavar="S1,S2",
        help="legacy profile: the streams besides SYSTEM.BROKER.DEFAULT.STREAM and "
        "SYSTEM.BROKER.ADMIN.STREAM (their queues are defined and serviced)",
    )
    # ---- end of network node and legacy profile ----


def supported_streams(args: argparse.Namespace) -> frozenset[str] | None:
    """The legacy profile's stream set (always with the default and admin streams);
    None for the gateway profile (every stream)."""
    if args.profile != PROFILE_LEGACY:
        return None
    named = {s.strip() for s in str(args.supported_streams).split(",") if s.strip()}
    return frozenset(named | {DEFAULT_STREAM, ADMIN_STREAM})


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    if args.profile != PROFILE_LEGACY and args.supported_streams:
        raise ValueError("--supported-streams needs --profile legacy")
    if args.listen is not None and not 0 <= args.listen <= 65535:
        raise ValueError(f"--listen {args.listen}: a port is 0 (any free port) to 65535")
    streams = []
    for spec in args.stream:
        name, _, flag = str(spec).partition(":")
        streams.append(StreamQueueConfig(name=name, implicit_stream_naming=flag != "noimplicit"))
    known = {s.name for s in streams}
    for name in sorted(supported_streams(args) or ()):
        if name not in known and name != DEFAULT_STREAM:
            streams.append(StreamQueueConfig(name=name))
    neighbours = [parse_neighbour_spec(spec) for spec in args.neighbour]
    return BrokerConfig(streams=streams, batch_size=args.batch_size, neighbours=neighbours)


def legacy_queues(config: BrokerConfig) -> Callable[[EmbeddedQueueManager], None]:
    """Define the queues of a V6 broker that are missing: control queue, default and
    admin streams, the inter-broker queue (read by the neighbour links, not serviced as
    a stream) and every supported stream's queue."""
    names = [CONTROL_QUEUE, DEFAULT_STREAM, ADMIN_STREAM, INTER_BROKER_QUEUE]
    names += [s.name for s in config.streams]

    def define(qm: EmbeddedQueueManager) -> None:
        for name in names:
            if name not in qm.catalogue.queues:
                qm.run_mqsc(f"DEFINE QLOCAL('{name}') DEFPSIST(YES)", stop_on_error=True)
                log.info("defined queue %s", name)

    return define


def run_command(args: argparse.Namespace) -> int:
    from gateway.mq.embedded.mqsc import MQSCError
    from gateway.pubsub.sqlite_store import SqliteStore
    from gateway.runtime.network_node import start_node

    try:
        config = config_from_args(args)
        mqsc = args.mqsc.read_text(encoding="utf-8") if args.mqsc else ""
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        print(f"mqgw broker: invalid setting {where}: {first['msg']}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"mqgw broker: {exc}", file=sys.stderr)
        return 2
    streams = supported_streams(args)

    async def main() -> None:
        from gateway.runtime.neighbours.attach import links_for, with_admin_stream
        from gateway.runtime.qm_status import serve_local_socket

        node = await start_node(
            args.qmgr,
            args.qmgr_path,
            mqsc=mqsc,
            listener_port=args.listen,
            before_channels=legacy_queues(config) if streams is not None else None,
        )
        qm = node.qm
        server = await serve_local_socket(qm, args.store, runner="broker", log=log)
        store = SqliteStore(args.store)
        engine = PubSubEngine(
            qm.name,
            store,
            broker_queues=config.broker_queues,
            suspend_after=config.suspend_subscription_after,
            supported_streams=streams,
        )
        service = BrokerService(
            qm, engine, with_admin_stream(config), forgiven=ForgivenBackouts(args.store)
        )
        links = links_for(service, args.store, config.neighbours)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, service.request_stop)
        switching = apply_switch_interval(f"broker {qm.name}")  # the application's, as mqgw run
        try:
            await service.start()
            await links.start()
            where = f"127.0.0.1 {node.port}" if args.listen is not None else "no listener"
            print(f"READY {qm.name} {where}", flush=True)
            await service.run()
        finally:
            switching.release()
            await links.stop()
            await service.stop()
            if server is not None:
                await server.stop()
            await node.stop()
            store.close()
            service.forgiven.close()
            links.state.close()

    try:
        asyncio.run(main())
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
    except MQSCError as exc:
        print(f"mqgw broker: {args.mqsc}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mqgw broker: --listen {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.runtime.pubsub_service.cli``: the same as ``mqgw broker``."""
    parser = argparse.ArgumentParser(prog="python -m gateway.runtime.pubsub_service.cli")
    add_arguments(parser)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
