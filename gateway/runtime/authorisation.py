"""The running gateway's :class:`~gateway.pubsub.authorisation.Authoriser`, built from
the ``authorisation:`` section (``gateway.runtime.authorisation_config``) and what the
queue manager says (its transmission queues, the gateway's own user identifier).

Why apart from the config model: the model is pure data; this wiring needs the loaded
gateway config and the open queue manager (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from gateway.mq.embedded.context import process_user
from gateway.mq.port import QueueManager
from gateway.pubsub.authorisation import Authoriser
from gateway.runtime.config import EmbeddedQueueManagerConfig, GatewayConfig

__all__ = ["authoriser_for"]

log = logging.getLogger(__name__)


def authoriser_for(
    config: GatewayConfig, qm: QueueManager, broker_queues: Collection[str]
) -> Authoriser:
    """The running gateway's :class:`Authoriser`: its policy, the queues the broker keeps
    (``broker_queues`` and the request/reply queue), the embedded queue manager's
    transmission queues, and the user identifiers of the gateway's own connections."""
    section = config.authorisation
    known = {p.name for p in config.plugins}
    for name in section.plugins:
        if name not in known:
            log.warning(
                "authorisation.plugins.%s names no plugin instance: its rules apply to none",
                name,
            )
    qmc = config.queue_manager
    users = set(section.gateway_user_ids)
    if isinstance(qmc, EmbeddedQueueManagerConfig):
        users.add(process_user())
    elif qmc.user:
        users.add(qmc.user)
    def is_transmission_queue(queue: str) -> bool:
        catalogue = getattr(qm, "catalogue", None)  # the embedded queue manager's, now
        if catalogue is None:
            return False  # IBM MQ: its own authority checks (docs/security.md)
        found = catalogue.queues.get(queue)
        return found is not None and bool(found.is_xmitq)

    keep = {*broker_queues}
    rr = config.request_reply
    if rr.requests or rr.services:
        keep.add(rr.reply_queue)
    return Authoriser(
        section.policy(),
        qm.name,
        keep,
        is_transmission_queue,
        gateway_users=users,
    )
