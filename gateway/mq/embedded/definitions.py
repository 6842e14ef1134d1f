"""The definitions of a live embedded queue manager as MQSC changes them.

Why apart from :mod:`.qmgr`: a definition change must keep four things in step (the
store, the catalogue, the in-memory local queues and the definition listeners such as
the repository manager); this is the one place that does it, and the
:class:`~.mqsc_run.MQSCTarget` the MQSC runner works through.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.mq.embedded.objects import (
    CLUSTER_REPOSITORY_QUEUE,
    ChannelDef,
    ObjectCatalogue,
    QMgrAttrs,
    QType,
    QueueDef,
)
from gateway.mq.embedded.queues import LocalQueue
from gateway.mq.embedded.repository import Repository, display_rows

if TYPE_CHECKING:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)


class QueueManagerDefinitions:
    """The definitions of a live queue manager as the MQSC runner changes them
    (:class:`~.mqsc_run.MQSCTarget`): store, catalogue, local queues and listeners in step."""

    def __init__(self, qm: EmbeddedQueueManager) -> None:
        self._qm = qm

    @property
    def catalogue(self) -> ObjectCatalogue:
        return self._qm._catalogue

    def current_depth(self, q_name: str) -> int:
        q = self._qm._queues.get(q_name)
        return q.depth if q is not None else 0

    def open_count(self, q_name: str) -> tuple[int, int]:
        q = self._qm._queues.get(q_name)
        return (q.input_count, q.output_count) if q is not None else (0, 0)

    def uncommitted(self, q_name: str) -> int:
        q = self._qm._queues.get(q_name)
        return q.locked + q.pending_puts if q is not None else 0

    def save_queue(self, definition: QueueDef) -> None:
        qm = self._qm
        qm._store.save_queue(definition)
        qm._catalogue.queues[definition.name] = definition
        if definition.qtype is QType.LOCAL:
            q = qm._queues.setdefault(definition.name, LocalQueue(definition.name))
            q.wake()  # waiters re-check GET(DISABLED) and MAXDEPTH changes
        qm._notify_definition("QUEUE", definition.name)

    def delete_queue(self, q_name: str, purge: bool) -> None:
        qm = self._qm
        qm._store.delete_queue(q_name)
        del qm._catalogue.queues[q_name]
        q = qm._queues.pop(q_name, None)
        if q is not None:
            q.clear()
            q.wake()
        qm._notify_definition("QUEUE", q_name)

    def save_qmgr(self, attrs: QMgrAttrs) -> None:
        self._qm._store.save_qmgr(attrs)
        self._qm._catalogue.qmgr = attrs
        self._qm._notify_definition("QMGR", attrs.name)

    def save_channel(self, definition: ChannelDef) -> None:
        self._qm._store.save_channel(definition)
        self._qm._catalogue.channels[definition.name] = definition
        self._qm._notify_definition("CHANNEL", definition.name)

    def delete_channel(self, name: str) -> None:
        self._qm._store.delete_channel(name)
        self._qm._catalogue.channels.pop(name, None)
        self._qm._notify_definition("CHANNEL", name)

    def status_report(self, what: str, pattern: str) -> list[list[str]] | None:
        """DISPLAY CHSTATUS/SUB/PUBSUB rows from the provider registered on the queue
        manager (``status_reports``); without one, no channel runs here (CHSTATUS shows
        none) and the broker's state is unknown (None)."""
        provider = self._qm.status_reports.get(what)
        if provider is not None:
            return provider(pattern)
        return [] if what == "CHSTATUS" else None

    def cluster_report(self, what: str, pattern: str) -> list[list[str]]:
        report = getattr(self._qm.remote_directory, "display", None)
        if report is not None:
            rows: list[list[str]] = report(what, pattern)
            return rows
        # not running in a network (e.g. `mqgw mqsc`): show the stored repository
        q = self._qm._queues.get(CLUSTER_REPOSITORY_QUEUE)
        stored = max(q.available.values(), key=lambda m: m.seq, default=None) if q else None
        if stored is None:
            return []
        try:
            repository = Repository.decode(stored.body)
        except (ValueError, TypeError, KeyError):
            log.warning("%s: the stored cluster repository cannot be read", self._qm.name)
            return []
        return display_rows(repository, what, pattern, self._qm.name)
