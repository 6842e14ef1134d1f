"""Wiring the neighbour links to a broker service (``mqgw run``, ``mqgw broker``): one
home for what both commands do, so they cannot drift apart."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.pubsub.streams import ADMIN_STREAM, CONTROL_QUEUE
from gateway.runtime.neighbours.config import NeighbourConfig
from gateway.runtime.neighbours.links import NeighbourLinks
from gateway.runtime.neighbours.state import NeighbourState, neighbours_db_of
from gateway.runtime.pubsub_service.config import BrokerConfig, StreamQueueConfig
from gateway.runtime.pubsub_service.service import BrokerService

__all__ = ["links_for", "runs_neighbour_links", "with_admin_stream"]


def runs_neighbour_links(config: Any, store: Path) -> bool:
    """Neighbour links run on the embedded queue manager (it defines their queues), and
    on IBM MQ once neighbours are configured or joined (docs/neighbours.md); where they
    run, the broker services SYSTEM.BROKER.ADMIN.STREAM too (:func:`with_admin_stream`).
    ``config``: the gateway section of a loaded configuration."""
    from gateway.runtime.config import EmbeddedQueueManagerConfig

    return (
        isinstance(config.queue_manager, EmbeddedQueueManagerConfig)
        or bool(config.neighbours)
        or neighbours_db_of(store).is_file()
    )


def with_admin_stream(config: BrokerConfig) -> BrokerConfig:
    """``config`` servicing SYSTEM.BROKER.ADMIN.STREAM too: probes and the neighbours'
    admin publications are published there (without Implicit Stream Naming: a command
    on it names its stream)."""
    if any(s.name == ADMIN_STREAM for s in config.streams):
        return config
    admin = StreamQueueConfig(name=ADMIN_STREAM, implicit_stream_naming=True)
    return config.model_copy(update={"streams": [*config.streams, admin]})


def links_for(
    service: BrokerService,
    pubsub_store: Path,
    configured: Sequence[NeighbourConfig],
    *,
    sync_interval: float = 1.0,
    clock: Callable[[], float] = time.time,
) -> NeighbourLinks:
    """Links for ``service`` with ``neighbours.db`` next to ``pubsub_store``, synced
    after every unit the service commits; a legacy-profile engine's supported streams
    are the links' fixed streams. The caller starts and stops them and closes
    ``links.state``. ``clock``: the links' clock (tests move it forward)."""
    engine = service.engine
    links = NeighbourLinks(
        service.qm,
        NeighbourState(neighbours_db_of(pubsub_store)),
        subscriptions=lambda: engine.subscriptions,
        subscriptions_revision=lambda: engine.subscriptions_revision,
        set_neighbours=engine.set_neighbours,
        drop_subscriptions=service.drop_neighbour_subscriptions,
        configured=configured,
        own_streams=[q for q, _ in service.serviced_queues if q != CONTROL_QUEUE],
        fixed_streams=engine.supported_streams,
        sync_interval=sync_interval,
        clock=clock,
        dead_letter_queue=service.config.dead_letter_queue,
        default_backout_threshold=service.config.default_backout_threshold,
    )
    service.after_commit.append(links.wake)
    return links
