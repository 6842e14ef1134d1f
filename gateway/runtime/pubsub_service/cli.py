"""``mqgw broker``: run the publish/subscribe service alone on an embedded queue manager
(no plugins). Also ``python -m gateway.runtime.pubsub_service.cli``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from gateway.pubsub.engine import PubSubEngine
from gateway.runtime.neighbours.config import parse_neighbour_spec
from gateway.runtime.pubsub_service.config import BrokerConfig, StreamQueueConfig
from gateway.runtime.pubsub_service.errors import BrokerError
from gateway.runtime.pubsub_service.forgiven_backouts import ForgivenBackouts
from gateway.runtime.pubsub_service.service import BrokerService

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mqgw broker``: run the publish/subscribe broker on an embedded queue manager."""
    p = subparsers.add_parser(
        "broker",
        help="run the MQ publish/subscribe broker (embedded queue manager)",
        description="Service SYSTEM.BROKER.CONTROL.QUEUE, SYSTEM.BROKER.DEFAULT.STREAM and "
        "the given stream queues of an embedded queue manager.",
    )
    add_arguments(p)
    p.set_defaults(func=run_command)


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
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--neighbour",
        action="append",
        default=[],
        metavar="QM[:kind[:role[:S1,S2]]]",
        help="neighbour broker to join (kind mqpubsub|mqv7|gateway, role child|parent, "
        "streams to share); repeatable",
    )


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    streams = []
    for spec in args.stream:
        name, _, flag = str(spec).partition(":")
        streams.append(StreamQueueConfig(name=name, implicit_stream_naming=flag != "noimplicit"))
    neighbours = [parse_neighbour_spec(spec) for spec in args.neighbour]
    return BrokerConfig(streams=streams, batch_size=args.batch_size, neighbours=neighbours)


def run_command(args: argparse.Namespace) -> int:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager
    from gateway.pubsub.sqlite_store import SqliteStore

    try:
        config = config_from_args(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        print(f"mqgw broker: invalid setting {where}: {first['msg']}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"mqgw broker: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        from gateway.runtime.neighbours.attach import links_for, with_admin_stream

        qm = EmbeddedQueueManager(args.qmgr, args.qmgr_path)
        store = SqliteStore(args.store)
        engine = PubSubEngine(
            qm.name,
            store,
            broker_queues=config.broker_queues,
            suspend_after=config.suspend_subscription_after,
        )
        service = BrokerService(
            qm, engine, with_admin_stream(config), forgiven=ForgivenBackouts(args.store)
        )
        links = links_for(service, args.store, config.neighbours)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, service.request_stop)
        try:
            await service.start()
            await links.start()
            await service.run()
        finally:
            await links.stop()
            await service.stop()
            await qm.close()
            store.close()
            service.forgiven.close()
            links.state.close()

    try:
        asyncio.run(main())
    except BrokerError as exc:
        log.error("%s", exc)
        return 1
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
