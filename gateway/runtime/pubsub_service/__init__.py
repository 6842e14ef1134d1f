"""The publish/subscribe service: the gateway's main loop.

One publication's way through the gateway starts here: ``service.BrokerService`` gets a
batch from a serviced MQ stream queue, lets the engine (``gateway.pubsub``) handle it,
puts MQ deliveries (``dead_letter.put_all``; what cannot be put is set aside on the
dead-letter queue), hands sink deliveries as envelopes to the plugins
(``gateway.runtime.envelopes``), then commits. ``config`` holds its settings, ``cli`` the
``mqgw broker`` sub-command that runs it alone.
"""

from __future__ import annotations

from gateway.runtime.pubsub_service.config import (
    DEAD_LETTER_QUEUE,
    BrokerConfig,
    StreamQueueConfig,
)
from gateway.runtime.pubsub_service.errors import BrokerError
from gateway.runtime.pubsub_service.service import BrokerService, ServiceCounters

__all__ = [
    "DEAD_LETTER_QUEUE",
    "BrokerConfig",
    "BrokerError",
    "BrokerService",
    "ServiceCounters",
    "StreamQueueConfig",
]
