"""Queue-manager clusters: the repository manager of one queue manager.

Why: a cluster lets members find each other's queues without per-queue definitions (seed
``clusters.ja.txt``, digest §Repositories; IBM MQ "How clusters work").
:class:`ClusterManager` is the repository manager and the
:class:`~gateway.mq.embedded.name_resolution.RemoteDirectory` of one queue manager: it
advertises the queue manager's own cluster objects, exchanges repository commands
(:mod:`.repository_commands`) on ``SYSTEM.CLUSTER.COMMAND.QUEUE`` (through
``SYSTEM.CLUSTER.TRANSMIT.QUEUE`` and the cluster channels, like any other message),
keeps its repository (:mod:`.repository`, pure state) as a message on
``SYSTEM.CLUSTER.REPOSITORY.QUEUE``, learns names on first use (partial repository),
balances puts round robin across instances and starts cluster-sender channels on demand.

About 550 lines, one class, on purpose: its publish path and its command path follow one
rule (snapshot the repository, change it, undo exactly one's own side if the unit of
work backs out) and are easier to check side by side; records, commands and storage
are already apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.mq.embedded.cluster_transmit import cluster_correl_id
from gateway.mq.embedded.name_resolution import ClusterQueue
from gateway.mq.embedded.objects import (
    CLUSTER_COMMAND_QUEUE,
    CLUSTER_TRANSMIT_QUEUE,
)
from gateway.mq.embedded.repository import (
    QMGR,
    QUEUE,
    Repository,
    RepositoryRecord,
    as_deleted,
    display_rows,
    member_clusters,
    own_records,
    with_seq,
)
from gateway.mq.embedded.repository_commands import (
    RepositoryCommandError,
    decode_command,
    encode_command,
    query_command,
    update_command,
)
from gateway.mq.embedded.repository_queue import load_repository, save_repository
from gateway.mq.port import Browse, GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.constants import Feedback, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

if TYPE_CHECKING:
    from gateway.mq.embedded.connection import EmbeddedConnection
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)

#: How long a partial repository waits for a full repository to answer a query.
QUERY_TIMEOUT_S = 5.0
#: A name a full repository did not know is not asked about again for this long.
NEGATIVE_CACHE_S = 1.0
#: A readable repository command backed out this often goes to the dead-letter queue,
#: so one command that keeps failing never blocks SYSTEM.CLUSTER.COMMAND.QUEUE.
COMMAND_BACKOUT_THRESHOLD = 3

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
        #: Stores the repository under a unit of work; the command that changed it
        #: commits with it. Replaceable (tests make it fail to see the backout).
        self.store_repository: Callable[[EmbeddedConnection, Repository], Awaitable[None]] = (
            save_repository)
        self.qm: EmbeddedQueueManager | None = None
        self.node: Any = None
        self.partners: dict[tuple[str, str], _Partner] = {}
        self._rr: dict[str, itertools.count[int]] = {}
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._negative: dict[tuple[str, ...], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._publish_task: asyncio.Task[None] | None = None
        self._waiting: set[tuple[str, str]] = set()
        #: Queries about members a waiting message needs (:meth:`_ask_for_member`), and
        #: when each member was last asked about.
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._asked_at: dict[str, float] = {}
        self._closed = False
        self._query_ids = itertools.count(1)
        self._force_publish = False
        self._publish_again = False

    # ------------------------------------------------------------------ membership

    @property
    def clusters(self) -> set[str]:
        """Clusters this queue manager is a member of (it has a CLUSRCVR for them)."""
        return set() if self.qm is None else member_clusters(self.qm.catalogue)

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
            self._ask_for_member(hop)
            return
        channel, conname = endpoint
        self.node.cluster_sender(hop, lane, channel, conname)

    def _ask_for_member(self, hop: str) -> None:
        """A message waits for a member whose record this partial repository lacks: ask
        a full repository (the query also subscribes to it, so a record the full
        repository learns later is sent on; its arrival starts the channel). At most
        once per member per ``NEGATIVE_CACHE_S``, whatever the answer was, so messages
        waiting for a member no answer gives a channel do not each send a query."""
        if self._closed or self.qm is None or self.qm.stopping or hop in self._asking:
            return
        if all(self.is_full(c) for c in self.clusters):
            return  # nobody to ask: a full repository knows what its cluster told it
        now = time.monotonic()
        if self._asked_at.get(hop, -NEGATIVE_CACHE_S) + NEGATIVE_CACHE_S > now:
            return
        self._asked_at[hop] = now
        self._asking[hop] = asyncio.get_running_loop().create_task(
            self._learn_member(hop), name=f"{self.q_mgr_name}: ask about {hop}")

    async def _learn_member(self, hop: str) -> None:
        try:
            await self.learn("", hop)
        except Exception:
            log.exception("%s: asking about cluster member %s failed", self.q_mgr_name, hop)
        finally:
            self._asking.pop(hop, None)

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
                await self._send_now(frs[0], query_command(qid, cluster, names))
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
        self._closed = True  # no new publish or query from here on
        for t in (self._task, self._publish_task, *list(self._asking.values())):
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
        if self._closed or self.qm is None or self.qm.stopping:
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
        desired = own_records(self.qm.catalogue, self.q_mgr_name, self.clusters)
        changed: list[RepositoryRecord] = []
        for key, rec in desired.items():
            held = repo.records.get(key)
            if held is None or not held.same_content(rec) or held.deleted:
                rec = with_seq(rec, repo.next_seq())
                repo.apply(rec)
                changed.append(rec)
        for key, held in list(repo.records.items()):
            if held.q_mgr == self.q_mgr_name and key not in desired and not held.deleted:
                rec = with_seq(as_deleted(held), repo.next_seq())
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
                    await self._send(conn, target, update_command(items, self.q_mgr_name))
                if self.is_full(cluster):
                    await self._notify_subscribers(conn, items, exclude={self.q_mgr_name},
                                                   subscribe_hosts=False)
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
            cmd = decode_command(msg.body)
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
            # the hosts too, so a later change of a host's channel reaches the asker
            self.repository.subscribe({r.name for r in items if r.kind == QMGR}, sender)
            self.repository.stats.queries_answered += 1
            await self._send(conn, sender,
                             update_command(items, self.q_mgr_name, answer=cmd.get("id")))
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
                        await self._send(conn, fr, update_command(items, self.q_mgr_name))
                await self._notify_subscribers(conn, items, exclude={sender} | origins)
                for r in items:
                    if r.kind == QMGR and not r.deleted:
                        # a member joined or changed: tell it the full repositories, and a
                        # new full repository everything
                        known = (self.repository.live([cluster]) if r.full
                                 else self.repository.full_repositories(cluster))
                        told = [k for k in known if k.q_mgr != r.name]
                        if told:
                            await self._send(conn, r.name, update_command(told, self.q_mgr_name))
        for r in changed:
            if r.kind == QMGR and r.full and not r.deleted and not self.is_full(r.cluster):
                self.schedule_publish(force=True)  # tell the newly known full repository
            if r.kind == QMGR:
                for hop, lane in list(self._waiting):
                    if hop == r.name:
                        self._waiting.discard((hop, lane))
                        self.message_waiting(hop, lane)

    async def _notify_subscribers(
        self, conn: EmbeddedConnection, items: list[RepositoryRecord], exclude: set[str],
        *, subscribe_hosts: bool = True,
    ) -> None:
        """Tell each subscriber of a changed name; a subscriber told of a queue is told
        of its host too: it may have asked about the queue before this repository knew
        either, and cannot send to the queue without the host's channel. The command
        path (``subscribe_hosts``) also subscribes it to the host, so later changes of
        the host's channel reach it; the publisher, whose hosts are this queue manager,
        leaves subscriptions to the command path (each undoes only its own changes)."""
        by_target: dict[str, list[RepositoryRecord]] = {}
        for r in items:
            for sub in self.repository.subscribers.get(r.name, ()):
                if sub not in exclude and sub != self.q_mgr_name:
                    by_target.setdefault(sub, []).append(r)
        members = {(r.cluster, r.name): r for r in self.repository.records.values()
                   if r.kind == QMGR}
        for target, recs in by_target.items():
            hosts = {members[key] for key in ((r.cluster, r.q_mgr) for r in recs
                                              if r.kind == QUEUE) if key in members}
            hosts.difference_update(recs)
            if subscribe_hosts:
                self.repository.subscribe({h.name for h in hosts}, target)
            recs += sorted(hosts, key=lambda h: h.key)
        for target, recs in sorted(by_target.items()):
            await self._send(conn, target, update_command(recs, self.q_mgr_name))

    async def _send(self, conn: EmbeddedConnection, target: str, cmd: dict[str, Any]) -> None:
        """Put a repository command for ``target`` under the caller's unit of work."""
        if target == self.q_mgr_name:
            return
        md = MQMD(format="MQSTR", persistence=Persistence.PERSISTENT)
        try:
            await conn.put1(CLUSTER_COMMAND_QUEUE, md, encode_command(cmd),
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
            await conn.put1(CLUSTER_COMMAND_QUEUE, md, encode_command(
                cmd | {"from": self.q_mgr_name}), PutOptions(), q_mgr_name=target)
        finally:
            await conn.disconnect()

    async def _save(self, conn: EmbeddedConnection) -> None:
        await self.store_repository(conn, self.repository)

    async def _load(self) -> None:
        assert self.qm is not None
        stored = await load_repository(self.qm)
        if stored is not None:
            stored.stats = self.repository.stats
            self.repository = stored

    async def _kick_waiting(self) -> None:
        """Start channels for messages left on the cluster transmission queue (restart)."""
        assert self.qm is not None
        # a queue's host whose own record is missing too: its messages wait and ask
        hops = {r.name if r.kind == QMGR else r.q_mgr
                for r in self.repository.live(self.clusters)}
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
