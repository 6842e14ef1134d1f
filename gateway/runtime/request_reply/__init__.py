"""Request/reply between MQ and the plugins' brokers, in the gateway process
(docs/request-reply.md): :class:`RequestReplyService` and how the app opens it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.mq.port import QueueManager
from gateway.pubsub.authorisation import Authoriser
from gateway.routing.correlation_store import CorrelationStore, CorrelationStoreError
from gateway.routing.routes import RequestReplyConfig
from gateway.runtime.errors import GatewayRuntimeError
from gateway.runtime.request_reply.service import RequestReplyService

__all__ = ["RequestReplyService", "reply_queue_mqsc", "start_request_reply"]


def reply_queue_mqsc(name: str) -> str:
    """The MQSC defining the reply queue on the embedded queue manager when missing."""
    return f"DEFINE QLOCAL('{name}') DEFPSIST(YES)"


async def start_request_reply(
    qm: QueueManager,
    config: RequestReplyConfig,
    store_path: Path,
    dead_letter_queue: str,
    authoriser: Authoriser | None = None,
    own_topic: Callable[[str, str], str] | None = None,
) -> RequestReplyService | None:
    """The started service, or None when no route is configured (nothing opened)."""
    if not config.requests and not config.services:
        return None
    try:
        store = CorrelationStore(store_path)
    except CorrelationStoreError as exc:
        raise GatewayRuntimeError(f"request_reply.store {store_path}: {exc}") from exc
    service = RequestReplyService(
        qm, config, store, dead_letter_queue=dead_letter_queue, authoriser=authoriser,
        own_topic=own_topic,
    )
    await service.start()
    return service
