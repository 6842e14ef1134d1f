"""Queue-manager clusters: repository records, full and partial repositories.

Why: a cluster lets members find each other's queues without per-queue definitions (seed
``clusters.ja.txt``, digest §Repositories; IBM MQ "How clusters work"). This module has
two parts:

* :class:`Repository` — pure state: records about cluster queue managers and cluster
  queues, each carrying the sequence number its origin gave it; an item whose sequence
  number is not newer than the one held is discarded, so an update that arrives twice
  (it always does: it is sent to two full repositories, which forward it) is applied
  once. Queries and subscriptions of partial repositories are kept here too.
* :class:`ClusterManager` — the repository manager of one queue manager and its
  :class:`~gateway.mq.embedded.name_resolution.RemoteDirectory`: it advertises the
  queue manager's own cluster objects, exchanges repository messages on
  ``SYSTEM.CLUSTER.COMMAND.QUEUE`` (through ``SYSTEM.CLUSTER.TRANSMIT.QUEUE`` and the
  cluster channels, like any other message), keeps its repository as a message on
  ``SYSTEM.CLUSTER.REPOSITORY.QUEUE``, learns names on first use (partial repository),
  balances puts round robin across instances and starts cluster-sender channels on
  demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.mq.embedded.name_resolution import ClusterQueue
from gateway.mq.embedded.objects import (
    CLUSTER_COMMAND_QUEUE,
    CLUSTER_REPOSITORY_QUEUE,
    CLUSTER_TRANSMIT_QUEUE,
    ChannelType,
    DefBind,
)
from gateway.mq.port import Browse, GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.constants import Feedback, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

if TYPE_CHECKING:
    from gateway.mq.embedded.connection import EmbeddedConnection
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)

QMGR, QUEUE = "QMGR", "QUEUE"
#: How long a partial repository waits for a full repository to answer a query.
QUERY_TIMEOUT_S = 5.0
#: A name a full repository did not know is not asked about again for this long.
NEGATIVE_CACHE_S = 1.0
#: A readable repository command backed out this often goes to the dead-letter queue,
#: so one command that keeps failing never blocks SYSTEM.CLUSTER.COMMAND.QUEUE.
COMMAND_BACKOUT_THRESHOLD = 3

_RECORD_FIELDS: dict[str, type] = {
    "kind": str, "cluster": str, "name": str, "q_mgr": str, "seq": int, "deleted": bool,
    "conname": str, "channel": str, "full": bool, "qtype": str, "q_mgr_alias": bool,
    "bind_not_fixed": bool,
}
_RECORD_REQUIRED = ("kind", "cluster", "name", "q_mgr", "seq")

RecordKey = tuple[str, str, str, str]


@dataclass(slots=True, frozen=True)
class RepositoryRecord:
    """One repository item: a cluster queue manager (``kind`` QMGR, with its CLUSRCVR
    channel and CONNAME) or a cluster queue (``kind`` QUEUE: a local queue, an alias
    queue, a remote definition or a queue-manager alias advertised by ``q_mgr``)."""

    kind: str
    cluster: str
    name: str
    q_mgr: str
    seq: int
    deleted: bool = False
    conname: str = ""
    channel: str = ""
    full: bool = False
    qtype: str = ""
    q_mgr_alias: bool = False
    bind_not_fixed: bool = False

    @property
    def key(self) -> RecordKey:
        return (self.kind, self.cluster, self.name, self.q_mgr)

    def same_content(self, other: RepositoryRecord) -> bool:
        a, b = asdict(self), asdict(other)
        a.pop("seq")
        b.pop("seq")
        return a == b

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RepositoryRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class RepositoryCommandError(MQError):
    """A message on SYSTEM.CLUSTER.COMMAND.QUEUE that is not a repository command; it is
    dead-lettered with ``feedback`` MQFB_NOT_A_REPOSITORY_MSG (280)."""

    def __init__(self, message: str) -> None:
        self.feedback = int(Feedback.NOT_A_REPOSITORY_MSG)
        super().__init__(Reason.FORMAT_ERROR, message)


def parse_command(body: bytes) -> dict[str, Any]:
    """Decode and check one repository command, so nothing later fails on its shape."""
    try:
        cmd = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RepositoryCommandError(f"not JSON: {exc}") from exc
    if not isinstance(cmd, dict):
        raise RepositoryCommandError(f"a JSON {type(cmd).__name__}, not an object")
    op = cmd.get("op")
    if op not in ("query", "update"):
        raise RepositoryCommandError(f"unknown op {op!r}")
    if not isinstance(cmd.get("from", ""), str):
        raise RepositoryCommandError("'from' is not a string")
    if op == "query":
        names = cmd.get("names")
        if not isinstance(cmd.get("cluster"), str) or not isinstance(names, list) \
                or not all(isinstance(n, str) for n in names):
            raise RepositoryCommandError("a query needs 'cluster' and a list of 'names'")
        return cmd
    records = cmd.get("records")
    if not isinstance(records, list):
        raise RepositoryCommandError("an update needs a list of 'records'")
    for i, raw in enumerate(records):
        if not isinstance(raw, dict):
            raise RepositoryCommandError(f"record {i} is not an object")
        missing = [k for k in _RECORD_REQUIRED if k not in raw]
        if missing:
            raise RepositoryCommandError(f"record {i} lacks {', '.join(missing)}")
        for k, typ in _RECORD_FIELDS.items():
            v = raw.get(k)
            if k in raw and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
                raise RepositoryCommandError(f"record {i}: {k} is not a {typ.__name__}")
    if cmd.get("answer") is not None and not isinstance(cmd["answer"], str):
        raise RepositoryCommandError("'answer' is not a string")
    return cmd


@dataclass(slots=True)
class RepositoryStats:
    applied: int = 0
    duplicates: int = 0
    queries_sent: int = 0
    queries_answered: int = 0
    updates_sent: int = 0


@dataclass(slots=True)
class Repository:
    """The records one queue manager holds (everything for a full repository, what it
    has needed for a partial one). Pure: no I/O."""

    records: dict[RecordKey, RepositoryRecord] = field(default_factory=dict)
    #: name -> queue managers that asked about it (full repository: told of changes)
    subscribers: dict[str, set[str]] = field(default_factory=dict)
    last_seq: int = 0
    stats: RepositoryStats = field(default_factory=RepositoryStats)

    def copy(self) -> Repository:
        """A snapshot to return to when a unit of work that changed this one backs out."""
        return Repository(dict(self.records), {k: set(v) for k, v in self.subscribers.items()},
                          self.last_seq, self.stats)

    def restore(self, saved: Repository, q_mgr_name: str, *, own: bool) -> None:
        """Undo a backed-out unit of work: records of ``q_mgr_name`` (``own``) or of every
        other queue manager (not ``own``) go back to ``saved``. The command loop changes
        only others' records and subscribers, the publisher only its own records, so
        each undoes its own changes without undoing the other's (last_seq only rises)."""
        for key in set(self.records) | set(saved.records):
            if (key[3] == q_mgr_name) != own:
                continue
            if key in saved.records:
                self.records[key] = saved.records[key]
            else:
                del self.records[key]
        if not own:
            self.subscribers = {k: set(v) for k, v in saved.subscribers.items()}

    def next_seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def apply(self, rec: RepositoryRecord) -> bool:
        """Apply ``rec`` unless a record with this or a newer sequence number is held."""
        held = self.records.get(rec.key)
        if held is not None and held.seq >= rec.seq:
            self.stats.duplicates += 1
            return False
        self.records[rec.key] = rec
        self.stats.applied += 1
        return True

    def live(self, clusters: Iterable[str] | None = None) -> list[RepositoryRecord]:
        wanted = set(clusters) if clusters is not None else None
        return [r for r in self.records.values()
                if not r.deleted and (wanted is None or r.cluster in wanted)]

    def queue_instances(self, q_name: str, clusters: Iterable[str]) -> list[RepositoryRecord]:
        return sorted((r for r in self.live(clusters)
                       if r.kind == QUEUE and r.name == q_name and not r.q_mgr_alias),
                      key=lambda r: r.q_mgr)

    def member(self, q_mgr: str, clusters: Iterable[str]) -> RepositoryRecord | None:
        for r in self.live(clusters):
            if r.kind == QMGR and r.name == q_mgr:
                return r
        return None

    def q_mgr_alias(self, name: str, clusters: Iterable[str]) -> RepositoryRecord | None:
        for r in sorted(self.live(clusters), key=lambda r: r.q_mgr):
            if r.kind == QUEUE and r.name == name and r.q_mgr_alias:
                return r
        return None

    def full_repositories(self, cluster: str) -> list[RepositoryRecord]:
        return sorted((r for r in self.live([cluster]) if r.kind == QMGR and r.full),
                      key=lambda r: r.name)

    def answer(self, cluster: str, names: Iterable[str]) -> list[RepositoryRecord]:
        """What a full repository tells a partial one asking about ``names``: the
        matching queue and queue-manager records plus the hosts' queue-manager records."""
        wanted = set(names)
        out = [r for r in self.records.values()
               if r.cluster == cluster and r.name in wanted]
        hosts = {r.q_mgr for r in out if r.kind == QUEUE}
        out += [r for r in self.records.values()
                if r.cluster == cluster and r.kind == QMGR and r.name in hosts
                and r not in out]
        return out

    def subscribe(self, names: Iterable[str], q_mgr: str) -> None:
        for n in names:
            self.subscribers.setdefault(n, set()).add(q_mgr)

    def to_json(self) -> dict[str, Any]:
        return {
            "last_seq": self.last_seq,
            "records": [r.to_json() for r in self.records.values()],
            "subscribers": {k: sorted(v) for k, v in self.subscribers.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Repository:
        repo = cls(last_seq=int(data.get("last_seq", 0)))
        for raw in data.get("records", []):
            rec = RepositoryRecord.from_json(raw)
            repo.records[rec.key] = rec
        repo.subscribers = {k: set(v) for k, v in data.get("subscribers", {}).items()}
        return repo


@dataclass(slots=True)
class _Partner:
    """A full repository reached through a manually defined cluster-sender channel."""

    cluster: str
    q_mgr: str
    channel: str
    conname: str


class ClusterManager:
    """Repository manager and remote directory of one embedded queue manager.

    ``senders`` is the network node's factory for cluster-sender channels
    (:meth:`gateway.mq.embedded.network.QueueManagerNode.cluster_sender`).
    """

    def __init__(self, q_mgr_name: str) -> None:
        self.q_mgr_name = q_mgr_name
        self.repository = Repository()
        self.qm: EmbeddedQueueManager | None = None
        self.node: Any = None
        self.partners: dict[tuple[str, str], _Partner] = {}
        self._rr: dict[str, itertools.count[int]] = {}
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._negative: dict[tuple[str, ...], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._publish_task: asyncio.Task[None] | None = None
        self._waiting: set[tuple[str, str]] = set()
        self._query_ids = itertools.count(1)
        self._force_publish = False
        self._publish_again = False

    # ------------------------------------------------------------------ membership

    @property
    def clusters(self) -> set[str]:
        """Clusters this queue manager is a member of (it has a CLUSRCVR for them)."""
        if self.qm is None:
            return set()
        out = {c.cluster for c in self.qm.catalogue.channels.values()
               if c.chltype is ChannelType.CLUSRCVR and c.cluster}
        if self.qm.catalogue.qmgr.repository:
            out.add(self.qm.catalogue.qmgr.repository)
        return out

    def is_full(self, cluster: str) -> bool:
        return self.qm is not None and self.qm.catalogue.qmgr.repository == cluster

    def full_repositories(self, cluster: str) -> list[str]:
        """Known full repositories of ``cluster`` other than this one, manual partner first."""
        names: list[str] = [p.q_mgr for p in self.partners.values() if p.cluster == cluster]
        for r in self.repository.full_repositories(cluster):
            if r.name not in names:
                names.append(r.name)
        return [n for n in names if n != self.q_mgr_name]

    # ------------------------------------------------------------------ RemoteDirectory

    def xmit_q_for_q_mgr(self, q_mgr_name: str) -> str | None:
        if self._endpoint(q_mgr_name) is not None:
            return CLUSTER_TRANSMIT_QUEUE
        alias = self.repository.q_mgr_alias(q_mgr_name, self.clusters)
        if alias is not None and alias.q_mgr != self.q_mgr_name:
            return CLUSTER_TRANSMIT_QUEUE
        return None

    def hop_for_q_mgr(self, q_mgr_name: str) -> str:
        if self._endpoint(q_mgr_name) is not None:
            return q_mgr_name
        alias = self.repository.q_mgr_alias(q_mgr_name, self.clusters)
        return alias.q_mgr if alias is not None else q_mgr_name

    def cluster_queue(self, q_name: str, bind_on_open: bool) -> ClusterQueue | None:
        """Round robin among the instances whose channel is not failing (all of them
        when every channel fails: the message then waits on the cluster xmitq)."""
        instances = [r for r in self.repository.queue_instances(q_name, self.clusters)
                     if r.q_mgr != self.q_mgr_name]
        if not instances:
            return None
        available = [r for r in instances if self._available(r.q_mgr)] or instances
        turn = next(self._rr.setdefault(q_name, itertools.count()))
        chosen = available[turn % len(available)]
        return ClusterQueue(chosen.q_mgr, CLUSTER_TRANSMIT_QUEUE, chosen.bind_not_fixed)

    def message_waiting(self, hop: str, lane: str) -> None:
        """A message for ``hop`` is on the cluster transmission queue: make sure a
        cluster-sender channel serves it (auto-definition, seed §cluster channels)."""
        if self.node is None:
            return
        endpoint = self._endpoint(hop)
        if endpoint is None:
            self._waiting.add((hop, lane))
            return
        channel, conname = endpoint
        self.node.cluster_sender(hop, lane, channel, conname)

    async def learn(self, q_name: str, q_mgr_name: str = "") -> bool:
        """Partial repository: ask a full repository about names not known yet."""
        if self.qm is None:
            return False
        names = tuple(n for n in (q_name, q_mgr_name) if n and n != self.q_mgr_name)
        if not names:
            return False
        now = time.monotonic()
        if self._negative.get(names, 0.0) > now:
            return False
        learned = False
        for cluster in sorted(self.clusters):
            if self.is_full(cluster):
                continue
            frs = self.full_repositories(cluster)
            if not frs:
                continue
            qid = f"{self.q_mgr_name}:{next(self._query_ids)}"
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._pending[qid] = fut
            try:
                await self._send_now(frs[0], {"op": "query", "id": qid, "cluster": cluster,
                                              "names": list(names)})
                self.repository.stats.queries_sent += 1
                async with asyncio.timeout(QUERY_TIMEOUT_S):
                    learned = await fut or learned
            except (TimeoutError, MQError) as exc:
                log.warning("%s: no answer from full repository %s about %s: %s",
                            self.q_mgr_name, frs[0], ", ".join(names), exc or "timeout")
            finally:
                self._pending.pop(qid, None)
        if not learned:
            self._negative[names] = now + NEGATIVE_CACHE_S
        return learned

    # ------------------------------------------------------------------ DISPLAY

    def display(self, what: str, pattern: str) -> list[list[str]]:
        node = self.node
        return display_rows(self.repository, what, pattern, self.q_mgr_name,
                            None if node is None else node.channel_running)

    # ------------------------------------------------------------------ lifecycle

    async def attach(self, qm: EmbeddedQueueManager, node: Any) -> None:
        """Start the repository manager for ``qm`` (loads the stored repository)."""
        self.qm = qm
        self.node = node
        await self._load()
        qm.definition_listeners.append(self._on_definition)
        self._task = asyncio.get_running_loop().create_task(
            self._command_loop(), name=f"repository manager {qm.name}")
        self.schedule_publish()
        await self._kick_waiting()

    async def close(self) -> None:
        for t in (self._task, self._publish_task):
            if t is not None:
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
        self._task = self._publish_task = None

    def partner_found(self, cluster: str, channel: str, conname: str, q_mgr: str) -> None:
        """A manually defined cluster-sender reached full repository ``q_mgr``."""
        key = (cluster, channel)
        known = self.partners.get(key)
        self.partners[key] = _Partner(cluster, q_mgr, channel, conname)
        if known is None or known.q_mgr != q_mgr:
            self.schedule_publish(force=True)
            for hop, lane in list(self._waiting):
                if hop == q_mgr:
                    self._waiting.discard((hop, lane))
                    self.message_waiting(hop, lane)

    def _on_definition(self, kind: str, name: str) -> None:
        self.schedule_publish()

    def schedule_publish(self, force: bool = False) -> None:
        if self.qm is None or self.qm.stopping:
            return
        self._force_publish = self._force_publish or force
        if self._publish_task is not None and not self._publish_task.done():
            self._publish_again = True
            return
        self._publish_again = False
        self._publish_task = asyncio.get_running_loop().create_task(self._publish())

    # ------------------------------------------------------------------ internals

    def _endpoint(self, q_mgr: str) -> tuple[str, str] | None:
        """(channel, CONNAME) reaching cluster member ``q_mgr``, or None."""
        if q_mgr == self.q_mgr_name:
            return None
        for p in self.partners.values():
            if p.q_mgr == q_mgr:
                return p.channel, p.conname
        rec = self.repository.member(q_mgr, self.clusters)
        if rec is not None and rec.conname:
            return rec.channel, rec.conname
        return None

    def _available(self, q_mgr: str) -> bool:
        return self.node is None or not self.node.channel_failing(q_mgr)

    def _own_records(self) -> dict[RecordKey, RepositoryRecord]:
        """What this queue manager advertises now (sequence numbers not yet assigned)."""
        assert self.qm is not None
        cat = self.qm.catalogue
        out: dict[RecordKey, RepositoryRecord] = {}
        clusters = self.clusters
        for ch in cat.channels.values():
            if ch.chltype is ChannelType.CLUSRCVR and ch.cluster:
                rec = RepositoryRecord(QMGR, ch.cluster, self.q_mgr_name, self.q_mgr_name, 0,
                                       conname=ch.conname, channel=ch.name,
                                       full=cat.qmgr.repository == ch.cluster)
                out[rec.key] = rec
        for d in cat.queues.values():
            if d.cluster and d.cluster in clusters:
                rec = RepositoryRecord(
                    QUEUE, d.cluster, d.name, self.q_mgr_name, 0,
                    qtype=d.qtype.mqsc, q_mgr_alias=d.is_q_mgr_alias,
                    bind_not_fixed=d.default_bind is DefBind.NOTFIXED,
                )
                out[rec.key] = rec
        return out

    async def _publish(self) -> None:
        """Advertise changed own records to two full repositories (seed: every item is
        sent twice; the full repositories forward it to each other)."""
        try:
            while True:
                force, self._force_publish = self._force_publish, False
                self._publish_again = False
                await self._publish_once(force)
                if not self._publish_again:
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: advertising cluster objects failed", self.q_mgr_name)

    async def _publish_once(self, force: bool) -> None:
        saved = self.repository.copy()
        try:
            await self._publish_changes(force)
        except BaseException:
            # nothing was sent: the records must look unadvertised to the next publish
            self.repository.restore(saved, self.q_mgr_name, own=True)
            raise

    async def _publish_changes(self, force: bool) -> None:
        assert self.qm is not None
        repo = self.repository
        desired = self._own_records()
        changed: list[RepositoryRecord] = []
        for key, rec in desired.items():
            held = repo.records.get(key)
            if held is None or not held.same_content(rec) or held.deleted:
                rec = _with_seq(rec, repo.next_seq())
                repo.apply(rec)
                changed.append(rec)
        for key, held in list(repo.records.items()):
            if held.q_mgr == self.q_mgr_name and key not in desired and not held.deleted:
                rec = _with_seq(_deleted(held), repo.next_seq())
                repo.apply(rec)
                changed.append(rec)
        if force:
            changed = [r for r in repo.records.values() if r.q_mgr == self.q_mgr_name]
        if not changed:
            return
        conn = await self.qm.connect()
        try:
            for cluster in sorted({r.cluster for r in changed}):
                items = [r for r in changed if r.cluster == cluster]
                targets = self.full_repositories(cluster)[: 1 if self.is_full(cluster) else 2]
                for target in targets:
                    await self._send(conn, target, _update(items, self.q_mgr_name))
                if self.is_full(cluster):
                    await self._notify_subscribers(conn, items, exclude={self.q_mgr_name})
            await self._save(conn)
            await conn.commit()
        finally:
            await conn.disconnect()

    async def _command_loop(self) -> None:
        assert self.qm is not None
        while not self.qm.stopping:
            conn: EmbeddedConnection | None = None
            try:
                conn = await self.qm.connect()
                q = await conn.open(CLUSTER_COMMAND_QUEUE, OpenOption.INPUT_SHARED)
                while True:
                    msg = await q.get(GetOptions(wait_ms=60_000, syncpoint=True))
                    await self._handle_command(conn, msg)
            except asyncio.CancelledError:
                raise
            except MQError as exc:
                if self.qm.stopping or exc.reason in (Reason.Q_MGR_STOPPING,):
                    return
                if exc.reason != Reason.NO_MSG_AVAILABLE:
                    log.warning("%s repository manager: %s", self.qm.name, exc)
                    await asyncio.sleep(0.2)
            except Exception:
                log.exception("%s repository manager failed a command", self.qm.name)
                await asyncio.sleep(0.2)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()

    async def _handle_command(self, conn: EmbeddedConnection, msg: Message) -> None:
        """One command, one unit of work: the repository changes only if it commits."""
        try:
            cmd = parse_command(msg.body)
        except RepositoryCommandError as exc:
            await self._reject(conn, msg, exc.feedback, str(exc))
            return
        if msg.md.backout_count >= COMMAND_BACKOUT_THRESHOLD:
            await self._reject(conn, msg, int(Feedback.NOT_A_REPOSITORY_MSG),
                               f"backed out {msg.md.backout_count} times")
            return
        saved = self.repository.copy()
        try:
            answered = await self._process(conn, cmd)
            await self._save(conn)
            await conn.commit()
        except BaseException:
            # the command comes again (or is dead-lettered): it must apply afresh
            self.repository.restore(saved, self.q_mgr_name, own=False)
            raise
        for qid, learned in answered:
            fut = self._pending.get(qid)
            if fut is not None and not fut.done():
                fut.set_result(learned)

    async def _reject(self, conn: EmbeddedConnection, msg: Message, feedback: int,
                      why: str) -> None:
        """Move a command off the queue (to the dead-letter queue if there is one)."""
        log.error("%s: repository command %s dead-lettered: %s", self.q_mgr_name,
                  msg.md.msg_id.hex(), why)
        try:
            await conn.put_dead_letter(msg.md, msg.body, feedback, CLUSTER_COMMAND_QUEUE,
                                       syncpoint=True)
        except MQError as exc:
            log.error("%s: no dead-letter queue (%s): repository command %s discarded",
                      self.q_mgr_name, exc, msg.md.msg_id.hex())
        await conn.commit()

    async def _process(
        self, conn: EmbeddedConnection, cmd: dict[str, Any]
    ) -> list[tuple[str, bool]]:
        """Handle one checked repository command; returns answered query ids."""
        op = cmd.get("op")
        sender = str(cmd.get("from", ""))
        if op == "query":
            cluster = str(cmd.get("cluster", ""))
            names = [str(n) for n in cmd.get("names", [])]
            self.repository.subscribe(names, sender)
            items = self.repository.answer(cluster, names)
            self.repository.stats.queries_answered += 1
            await self._send(conn, sender, _update(items, self.q_mgr_name, answer=cmd.get("id")))
            return []
        if op != "update":
            return []
        changed = [r for r in (RepositoryRecord.from_json(x) for x in cmd.get("records", []))
                   if r.q_mgr != self.q_mgr_name and self.repository.apply(r)]
        answered: list[tuple[str, bool]] = []
        if cmd.get("answer"):
            answered.append((str(cmd["answer"]), bool(cmd.get("records"))))
        if changed:
            await self._after_change(conn, changed, sender)
        return answered

    async def _after_change(
        self, conn: EmbeddedConnection, changed: list[RepositoryRecord], sender: str
    ) -> None:
        for cluster in sorted({r.cluster for r in changed}):
            items = [r for r in changed if r.cluster == cluster]
            if self.is_full(cluster):
                origins = {r.q_mgr for r in items}
                for fr in self.full_repositories(cluster):
                    if fr != sender and fr not in origins:
                        await self._send(conn, fr, _update(items, self.q_mgr_name))
                await self._notify_subscribers(conn, items, exclude={sender} | origins)
                for r in items:
                    if r.kind == QMGR and not r.deleted:
                        # a member joined or changed: tell it the full repositories, and a
                        # new full repository everything
                        known = (self.repository.live([cluster]) if r.full
                                 else self.repository.full_repositories(cluster))
                        told = [k for k in known if k.q_mgr != r.name]
                        if told:
                            await self._send(conn, r.name, _update(told, self.q_mgr_name))
        for r in changed:
            if r.kind == QMGR and r.full and not r.deleted and not self.is_full(r.cluster):
                self.schedule_publish(force=True)  # tell the newly known full repository
            if r.kind == QMGR:
                for hop, lane in list(self._waiting):
                    if hop == r.name:
                        self._waiting.discard((hop, lane))
                        self.message_waiting(hop, lane)

    async def _notify_subscribers(
        self, conn: EmbeddedConnection, items: list[RepositoryRecord], exclude: set[str]
    ) -> None:
        by_target: dict[str, list[RepositoryRecord]] = {}
        for r in items:
            for sub in self.repository.subscribers.get(r.name, ()):
                if sub not in exclude and sub != self.q_mgr_name:
                    by_target.setdefault(sub, []).append(r)
        for target, recs in sorted(by_target.items()):
            await self._send(conn, target, _update(recs, self.q_mgr_name))

    async def _send(self, conn: EmbeddedConnection, target: str, cmd: dict[str, Any]) -> None:
        """Put a repository command for ``target`` under the caller's unit of work."""
        if target == self.q_mgr_name:
            return
        md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
        try:
            await conn.put1(CLUSTER_COMMAND_QUEUE, md, json.dumps(cmd).encode(),
                            PutOptions(syncpoint=True), q_mgr_name=target)
        except MQError as exc:
            log.warning("%s: cannot send repository update to %s: %s",
                        self.q_mgr_name, target, exc)
            return
        if cmd.get("op") == "update":
            self.repository.stats.updates_sent += 1

    async def _send_now(self, target: str, cmd: dict[str, Any]) -> None:
        assert self.qm is not None
        conn = await self.qm.connect()
        try:
            md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
            await conn.put1(CLUSTER_COMMAND_QUEUE, md, json.dumps(cmd | {
                "from": self.q_mgr_name}).encode(), PutOptions(), q_mgr_name=target)
        finally:
            await conn.disconnect()

    async def _save(self, conn: EmbeddedConnection) -> None:
        """Replace the repository message on SYSTEM.CLUSTER.REPOSITORY.QUEUE (same UOW)."""
        q = await conn.open(CLUSTER_REPOSITORY_QUEUE, OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        try:
            while True:
                try:
                    await q.get(GetOptions(wait_ms=0, syncpoint=True))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        break
                    raise
            md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
            await q.put(md, json.dumps(self.repository.to_json()).encode(),
                        PutOptions(syncpoint=True))
        finally:
            await q.close()

    async def _load(self) -> None:
        assert self.qm is not None
        conn = await self.qm.connect()
        try:
            q = await conn.open(CLUSTER_REPOSITORY_QUEUE, OpenOption.BROWSE)
            last: bytes | None = None
            browse = Browse.FIRST
            while True:
                try:
                    msg = await q.get(GetOptions(browse=browse))
                except MQError as exc:
                    if exc.reason == Reason.NO_MSG_AVAILABLE:
                        break
                    raise
                last = msg.body
                browse = Browse.NEXT
            if last is not None:
                stats = self.repository.stats
                self.repository = Repository.from_json(json.loads(last))
                self.repository.stats = stats
        finally:
            await conn.disconnect()

    async def _kick_waiting(self) -> None:
        """Start channels for messages left on the cluster transmission queue (restart)."""
        assert self.qm is not None
        from gateway.mq.embedded.cluster_transmit import cluster_correl_id

        hops = {r.name for r in self.repository.live(self.clusters) if r.kind == QMGR}
        hops |= {p.q_mgr for p in self.partners.values()}
        keys = {cluster_correl_id(h, lane): (h, lane) for h in hops for lane in ("", "CMD")}
        conn = await self.qm.connect()
        try:
            q = await conn.open(CLUSTER_TRANSMIT_QUEUE, OpenOption.BROWSE)
            browse = Browse.FIRST
            seen: set[tuple[str, str]] = set()
            while True:
                try:
                    msg = await q.get(GetOptions(browse=browse))
                except MQError:
                    break
                browse = Browse.NEXT
                found = keys.get(msg.md.correl_id)
                if found is not None:
                    seen.add(found)
        finally:
            await conn.disconnect()
        for hop, lane in sorted(seen):
            self.message_waiting(hop, lane)


def display_rows(
    repository: Repository, what: str, pattern: str, local: str,
    running: Callable[[str], bool] | None = None,
) -> list[list[str]]:
    """DISPLAY CLUSQMGR / QCLUSTER rows (attribute items) for records matching
    ``pattern``. Without ``running`` (queue manager not in a network) STATUS is INACTIVE."""

    def match(name: str) -> bool:
        return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern

    rows: list[list[str]] = []
    for r in sorted(repository.live(), key=lambda r: (r.name, r.cluster, r.q_mgr)):
        if what == "CLUSQMGR" and r.kind == QMGR and match(r.name):
            up = r.name == local or (running is not None and running(r.name))
            rows.append([f"CLUSQMGR({r.name})", f"CHANNEL({r.channel})",
                         f"CLUSTER({r.cluster})", f"CONNAME({r.conname})",
                         f"QMTYPE({'REPOS' if r.full else 'NORMAL'})",
                         f"STATUS({'RUNNING' if up else 'INACTIVE'})"])
        elif what == "QCLUSTER" and r.kind == QUEUE and match(r.name):
            rows.append([f"QUEUE({r.name})", "TYPE(QCLUSTER)", f"CLUSQMGR({r.q_mgr})",
                         f"CLUSTER({r.cluster})",
                         f"CLUSQT({'QMGR' if r.q_mgr_alias else r.qtype})",
                         f"DEFBIND({'NOTFIXED' if r.bind_not_fixed else 'OPEN'})"])
    return rows


def _with_seq(rec: RepositoryRecord, seq: int) -> RepositoryRecord:
    data = rec.to_json()
    data["seq"] = seq
    return RepositoryRecord.from_json(data)


def _deleted(rec: RepositoryRecord) -> RepositoryRecord:
    data = rec.to_json()
    data["deleted"] = True
    return RepositoryRecord.from_json(data)


def _update(
    records: Iterable[RepositoryRecord], sender: str, answer: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "update", "from": sender,
                           "records": [r.to_json() for r in records]}
    if answer:
        out["answer"] = answer
    return out
