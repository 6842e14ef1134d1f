"""The running gateway's :class:`~gateway.pubsub.authorisation.Authoriser`, built from
the ``authorisation:`` section (``gateway.runtime.authorisation_config``) and what the
queue manager says (its name resolution, its transmission queues, the gateway's own user
identifier).

Why apart from the config model: the model is pure data; this wiring needs the loaded
gateway config and the open queue manager (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from gateway.log_summary import SummarisedLog
from gateway.mq.embedded.context import process_user
from gateway.mq.embedded.objects import QType
from gateway.mq.port import MQError, QueueManager
from gateway.pubsub.authorisation import Authoriser, Decision, refusal_line
from gateway.pubsub.destinations import (
    OwnQueues,
    QueueResolver,
    ResolvedQueue,
    identity_resolver,
)
from gateway.runtime.config import EmbeddedQueueManagerConfig, GatewayConfig

__all__ = ["authoriser_for", "queue_resolver"]

log = logging.getLogger(__name__)


def queue_resolver(qm: QueueManager) -> QueueResolver:
    """MQ's name resolution of ``qm`` as a synchronous function: the embedded queue
    manager's own (its definitions and cluster directory, as MQOPEN would resolve now);
    by name alone elsewhere -- IBM MQ's definitions are the queue manager's, and its
    MQOPEN resolves them where the gateway opens the queue itself (request/reply)."""
    resolve = getattr(qm, "resolve", None)
    if resolve is None:
        return identity_resolver

    def resolver(q_mgr: str, queue: str) -> ResolvedQueue | None:
        try:
            found = resolve(queue, q_mgr)
        except MQError:
            return _unresolved_alias(qm, q_mgr, queue)
        return ResolvedQueue(found.q_mgr_name, found.q_name, tuple(found.path))

    return resolver


def _unresolved_alias(qm: QueueManager, q_mgr: str, queue: str) -> ResolvedQueue | None:
    """Where a local queue alias whose base queue is not defined yet would put a message
    once it is (a sink's backlog queue is defined when first needed): its target; None
    for anything else that does not resolve (the put fails: nothing lands anywhere)."""
    catalogue = getattr(qm, "catalogue", None)
    if catalogue is None or (q_mgr and q_mgr != qm.name):
        return None
    found = catalogue.get(queue)
    if found is None or found.qtype is not QType.ALIAS or not found.target:
        return None
    return ResolvedQueue(qm.name, found.target, (queue, f"{found.target} (not defined yet)"))


def request_reply_queues(config: GatewayConfig) -> set[str]:
    """The queues request/reply gets from: its reply queue and the service queues."""
    rr = config.request_reply
    kept = {s.queue for s in rr.services}
    if rr.requests or rr.services:
        kept.add(rr.reply_queue)
    return kept


def authoriser_for(
    config: GatewayConfig, qm: QueueManager, broker_queues: Collection[str]
) -> Authoriser:
    """The running gateway's :class:`Authoriser`: its policy, the queues the gateway
    keeps (``broker_queues``, the request/reply queues, every ``SYSTEM.`` and
    transmission queue) with the queue manager's name resolution, the user identifiers
    of the gateway's own connections, and a log that summarises refusals (one line per
    entrance and reason per minute, then a count: an outsider decides how many)."""
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

    def is_dead_letter_queue(queue: str) -> bool:
        """The embedded queue manager's DEADQ now (ALTER QMGR DEADQ may change it)."""
        catalogue = getattr(qm, "catalogue", None)
        return catalogue is not None and queue == catalogue.qmgr.dead_letter_q_name

    own = OwnQueues(
        qm.name,
        {*broker_queues, *request_reply_queues(config)},
        is_transmission_queue=is_transmission_queue,
        resolve=queue_resolver(qm),
        is_kept=is_dead_letter_queue,
    )
    summary = SummarisedLog(log)

    def report(entrance: str, decision: Decision, code: int) -> None:
        kind = f"{entrance} {decision.reason.value if decision.reason else ''}"
        summary.log(logging.WARNING, kind, "%s", refusal_line(entrance, decision, code))

    return Authoriser(
        section.policy(),
        qm.name,
        gateway_users=users,
        own_queues=own,
        report=report,
    )
