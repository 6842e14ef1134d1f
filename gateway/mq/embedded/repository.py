"""A cluster repository: the records one queue manager holds about cluster members and
cluster queues. Pure state, no I/O.

Why (seed ``clusters.ja.txt``, digest §Repositories; IBM MQ "How clusters work"): each
record carries the sequence number its origin gave it; a record whose sequence number
is not newer than the one held is discarded, so an update that arrives twice (it always
does: it is sent to two full repositories, which forward it) is applied once. Queries
and subscriptions of partial repositories are kept here too. The repository manager
that exchanges these records is :mod:`.cluster`; the command format is
:mod:`.repository_commands`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.mq.embedded.objects import ChannelType, DefBind, ObjectCatalogue

QMGR, QUEUE = "QMGR", "QUEUE"

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
        return out + [r for r in self.hosts(cluster, out) if r not in out]

    def hosts(self, cluster: str, records: Iterable[RepositoryRecord]) -> list[RepositoryRecord]:
        """The queue-manager records of ``cluster`` hosting the queue records among
        ``records``: a member told of a queue cannot send to it without its host's."""
        names = {r.q_mgr for r in records if r.kind == QUEUE and r.cluster == cluster}
        return [r for r in self.records.values()
                if r.cluster == cluster and r.kind == QMGR and r.name in names]

    def subscribe(self, names: Iterable[str], q_mgr: str) -> None:
        for n in names:
            self.subscribers.setdefault(n, set()).add(q_mgr)

    def to_json(self) -> dict[str, Any]:
        return {
            "last_seq": self.last_seq,
            "records": [r.to_json() for r in self.records.values()],
            "subscribers": {k: sorted(v) for k, v in self.subscribers.items()},
        }

    def encode(self) -> bytes:
        """The body of the message kept on SYSTEM.CLUSTER.REPOSITORY.QUEUE."""
        return json.dumps(self.to_json()).encode()

    @classmethod
    def decode(cls, body: bytes) -> Repository:
        """Read :meth:`encode`'s form (ValueError, TypeError or KeyError if damaged)."""
        return cls.from_json(json.loads(body))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Repository:
        repo = cls(last_seq=int(data.get("last_seq", 0)))
        for raw in data.get("records", []):
            rec = RepositoryRecord.from_json(raw)
            repo.records[rec.key] = rec
        repo.subscribers = {k: set(v) for k, v in data.get("subscribers", {}).items()}
        return repo


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


def with_seq(rec: RepositoryRecord, seq: int) -> RepositoryRecord:
    data = rec.to_json()
    data["seq"] = seq
    return RepositoryRecord.from_json(data)


def as_deleted(rec: RepositoryRecord) -> RepositoryRecord:
    data = rec.to_json()
    data["deleted"] = True
    return RepositoryRecord.from_json(data)


def member_clusters(catalogue: ObjectCatalogue) -> set[str]:
    """Clusters a queue manager is a member of: it has a CLUSRCVR for them (or is a full
    repository of one)."""
    out = {c.cluster for c in catalogue.channels.values()
           if c.chltype is ChannelType.CLUSRCVR and c.cluster}
    if catalogue.qmgr.repository:
        out.add(catalogue.qmgr.repository)
    return out


def own_records(
    catalogue: ObjectCatalogue, q_mgr_name: str, clusters: set[str]
) -> dict[RecordKey, RepositoryRecord]:
    """What a queue manager advertises now (sequence numbers not yet assigned): itself
    per CLUSRCVR, and every queue with CLUSTER() of a cluster it belongs to."""
    out: dict[RecordKey, RepositoryRecord] = {}
    for ch in catalogue.channels.values():
        if ch.chltype is ChannelType.CLUSRCVR and ch.cluster:
            rec = RepositoryRecord(QMGR, ch.cluster, q_mgr_name, q_mgr_name, 0,
                                   conname=ch.conname, channel=ch.name,
                                   full=catalogue.qmgr.repository == ch.cluster)
            out[rec.key] = rec
    for d in catalogue.queues.values():
        if d.cluster and d.cluster in clusters:
            rec = RepositoryRecord(
                QUEUE, d.cluster, d.name, q_mgr_name, 0,
                qtype=d.qtype.mqsc, q_mgr_alias=d.is_q_mgr_alias,
                bind_not_fixed=d.default_bind is DefBind.NOTFIXED,
            )
            out[rec.key] = rec
    return out
