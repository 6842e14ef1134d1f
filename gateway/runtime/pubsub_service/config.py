"""Settings of the publish/subscribe service (the YAML ``broker:`` section and
``mqgw broker`` flags): which stream queues are serviced, batching, backout and retry."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.runtime.neighbours.config import NeighbourConfig, unique_neighbours

__all__ = ["DEAD_LETTER_QUEUE", "BrokerConfig", "StreamQueueConfig"]

DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"


class StreamQueueConfig(BaseModel):
    """A serviced stream queue and its Implicit Stream Naming property."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = Field(min_length=1, max_length=48, pattern=r"^[A-Za-z0-9._%]{1,48}$")
    """A queue name that is also a stream name: no '/', which would put the stream's
    publications into another stream's topic space ($SYS/STREAM/<name>/...)."""
    implicit_stream_naming: bool = True
    """An MQRFH publication put on this queue without ``MQPSStreamName`` belongs to this stream;
    ``false``: to the default stream."""
    sinks: Literal["always", "owner"] = "always"
    """When this node's sinks (plugin instances) subscribe to the stream: ``always``, or
    ``owner``: only while this node owns it, i.e. while its publishing route (``route``)
    names the stream queue here. A node that does not own it makes no sink subscription
    to it at start and removes one its store kept; while a move holds the route, the
    store is kept as it is. ``mqgw streams move`` moves such subscriptions to the new
    owner (docs/scaling.md, "Moving a stream"). Needs the embedded queue manager."""
    route: str | None = Field(default=None, min_length=1, max_length=48,
                              pattern=r"^[A-Za-z0-9._%/]{1,48}$")
    """The stream's publishing route, a QALIAS on every node (default ``<name>.PUB``):
    whom it names is the stream's owner (``sinks: owner``; the default of ``mqgw
    streams move --route``)."""

    @property
    def publishing_route(self) -> str:
        """The QALIAS publishers put to (``route``, else ``<name>.PUB``)."""
        return self.route or f"{self.name}.PUB"


class BrokerConfig(BaseModel):
    """Settings of the broker service (YAML/CLI boundary)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    streams: list[StreamQueueConfig] = Field(default_factory=list)
    """The serviced stream queues besides SYSTEM.BROKER.DEFAULT.STREAM (always serviced, with
    SYSTEM.BROKER.CONTROL.QUEUE); one asyncio task and one MQ connection serve each."""
    default_stream_implicit_naming: bool = True
    """Implicit Stream Naming of SYSTEM.BROKER.DEFAULT.STREAM itself."""
    batch_size: int = Field(default=256, ge=1, le=5000)
    """Most messages got under one MQ unit of work (the same for a sink's forwarder);
    ``max_puts_per_unit`` may end a batch sooner. A cap, not a target: a batch takes what
    is waiting and never waits to fill, so it grows with the backlog and an idle stream
    still goes one message per unit of work (its latency does not depend on this). A
    bigger cap drains a backlog faster (one commit and one sink acknowledgement per
    batch) but holds the service's turn longer and backs out more messages together;
    a smaller one bounds those (docs/performance.md)."""
    max_puts_per_unit: int = Field(default=2000, ge=1)
    """A batch stops growing once its unit of work holds this many messages: gets,
    puts due and sink deliveries (MQ's MaxUncommittedMsgs counts gets and puts, and
    report and trigger messages, and is 10,000 by default; one publication with more
    matching subscribers than that cannot be delivered in one unit of work and ends
    on the backout queue). It can end a batch before ``batch_size``."""
    wait_ms: int = Field(default=500, ge=1, le=60_000)
    """Longest wait for a message per get (0 would make the service poll without rest)."""
    default_backout_threshold: int = Field(default=5, ge=1)
    """Used when a queue's BOTHRESH is 0 (MQ's "no backout processing"), so a poison
    message can never block its queue."""
    dead_letter_queue: str = DEAD_LETTER_QUEUE
    """Dead-letter queue when the queue manager cannot be asked for its DEADQ."""
    retry_delay: float = Field(default=0.2, ge=0.0)
    """Pause after a backed-out batch before the next get (seconds, doubles up to 10 s)."""
    sink_retry_max_delay: float = Field(default=5.0, gt=0.0)
    """Longest pause between attempts to hand a batch to a sink that is down (seconds).
    While a sink is down its deliveries wait on its backlog queue
    (``SYSTEM.MQGW.SINK.<instance>``) and their BackoutCount does not grow."""
    sink_backlog_max_depth: int = Field(default=100_000, ge=1, le=999_999_999)
    """MAXDEPTH of each sink's backlog queue when the gateway defines it (embedded queue
    manager). A full backlog holds the streams routed to that sink (back-pressure),
    and with them those streams' MQ subscribers and other sinks, until the sink
    catches up; streams not routed to it are not held."""
    reconnect_delay: float = Field(default=2.0, ge=0.0)
    """Pause between attempts to reconnect a serviced queue after its connection broke
    (seconds)."""
    suspend_subscription_after: int = Field(default=10, ge=1)
    """Consecutive failed puts to a subscriber queue (unknown, put inhibited, ...) after
    which its subscriptions are suspended until registered again (docs/pubsub.md)."""
    neighbours: list[NeighbourConfig] = Field(default_factory=list)
    """Neighbour brokers joined at start (docs/neighbours.md); ``mqgw broker
    --neighbour``. The gateway's YAML names them at the top level (``neighbours:``)."""

    @field_validator("neighbours")
    @classmethod
    def _one_per_q_mgr(cls, value: list[NeighbourConfig]) -> list[NeighbourConfig]:
        return unique_neighbours(value)

    @property
    def broker_queues(self) -> frozenset[str]:
        """Queues no subscriber may name besides ``SYSTEM.*``: the serviced stream
        queues and the dead-letter queue."""
        return frozenset([s.name for s in self.streams] + [self.dead_letter_queue])
