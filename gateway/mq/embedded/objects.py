"""Queue and queue-manager object definitions of the embedded queue manager.

The attributes are the MQSC subset the gateway relies on (IBM MQ "DEFINE queues",
"ALTER QMGR"). Definitions are plain values: name resolution, the MQSC runner and the
store all work on an :class:`ObjectCatalogue` without touching I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace
from typing import Any

#: MQ's limits (MQ_Q_NAME_LENGTH, MQ_Q_MGR_NAME_LENGTH).
Q_NAME_LENGTH = 48
Q_MGR_NAME_LENGTH = 48
#: DEFINE QLOCAL defaults (SYSTEM.DEFAULT.LOCAL.QUEUE on distributed platforms).
DEFAULT_MAXDEPTH = 5000
DEFAULT_MAXMSGL = 4_194_304
#: The largest MAXMSGL MQ accepts (100 MB).
MAX_MAXMSGL = 104_857_600
MAX_MAXDEPTH = 999_999_999

DEAD_LETTER_QUEUE = "SYSTEM.DEAD.LETTER.QUEUE"
BROKER_CONTROL_QUEUE = "SYSTEM.BROKER.CONTROL.QUEUE"
BROKER_DEFAULT_STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
CLUSTER_TRANSMIT_QUEUE = "SYSTEM.CLUSTER.TRANSMIT.QUEUE"
ADMIN_COMMAND_QUEUE = "SYSTEM.ADMIN.COMMAND.QUEUE"
CLUSTER_COMMAND_QUEUE = "SYSTEM.CLUSTER.COMMAND.QUEUE"
CLUSTER_REPOSITORY_QUEUE = "SYSTEM.CLUSTER.REPOSITORY.QUEUE"
BROKER_ADMIN_STREAM = "SYSTEM.BROKER.ADMIN.STREAM"

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/%")


class QType(enum.IntEnum):
    """MQQT_* values (cmqc.h)."""

    LOCAL = 1
    ALIAS = 3
    REMOTE = 6

    @property
    def mqsc(self) -> str:
        return {QType.LOCAL: "QLOCAL", QType.ALIAS: "QALIAS", QType.REMOTE: "QREMOTE"}[self]


class DefBind(enum.IntEnum):
    """MQBND_* values: DEFBIND(OPEN) binds a cluster queue instance at MQOPEN,
    DEFBIND(NOTFIXED) chooses one per MQPUT."""

    OPEN = 0
    NOTFIXED = 1


class ChannelType(enum.IntEnum):
    """MQCHT_* values of the message channels the embedded network runs."""

    SDR = 1
    RCVR = 3
    CLUSRCVR = 8
    CLUSSDR = 9


class Usage(enum.IntEnum):
    """MQUS_* values: a local queue is a normal queue or a transmission queue."""

    NORMAL = 0
    TRANSMISSION = 1


@dataclass(slots=True, frozen=True)
class QueueDef:
    """One queue object. Fields that do not apply to ``qtype`` keep their defaults.

    ``get_enabled``/``put_enabled`` are MQSC GET(ENABLED)/PUT(ENABLED); ``default_persistent``
    is DEFPSIST(YES); ``backout_threshold``/``backout_queue`` are BOTHRESH/BOQNAME, stored
    only (MQ itself never acts on them: applications, here the gateway runtime, do).
    """

    name: str
    qtype: QType
    description: str = ""
    max_depth: int = DEFAULT_MAXDEPTH
    max_msg_length: int = DEFAULT_MAXMSGL
    default_persistent: bool = False
    default_priority: int = 0
    backout_threshold: int = 0
    backout_queue: str = ""
    get_enabled: bool = True
    put_enabled: bool = True
    usage: Usage = Usage.NORMAL
    target: str = ""
    remote_name: str = ""
    remote_q_mgr_name: str = ""
    xmit_q_name: str = ""
    cluster: str = ""
    default_bind: DefBind = DefBind.OPEN

    @property
    def is_xmitq(self) -> bool:
        return self.qtype is QType.LOCAL and self.usage is Usage.TRANSMISSION

    @property
    def is_q_mgr_alias(self) -> bool:
        """A QREMOTE with blank RNAME: a queue-manager alias (or a reply-to alias target)."""
        return self.qtype is QType.REMOTE and not self.remote_name

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = int(value) if isinstance(value, enum.IntEnum) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QueueDef:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["qtype"] = QType(kwargs["qtype"])
        kwargs["usage"] = Usage(kwargs.get("usage", 0))
        kwargs["default_bind"] = DefBind(kwargs.get("default_bind", 0))
        return cls(**kwargs)

    def with_changes(self, **changes: Any) -> QueueDef:
        return replace(self, **changes)


@dataclass(slots=True, frozen=True)
class QMgrAttrs:
    """The queue manager's own attributes that the engine uses (ALTER QMGR)."""

    name: str
    dead_letter_q_name: str = DEAD_LETTER_QUEUE
    default_xmit_q_name: str = ""
    max_msg_length: int = DEFAULT_MAXMSGL
    description: str = ""
    coded_char_set_id: int = 1208
    #: REPOS(name): the cluster this queue manager is a full repository for.
    repository: str = ""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QMgrAttrs:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(slots=True, frozen=True)
class ChannelDef:
    """A message channel definition (IBM MQ "DEFINE CHANNEL").

    ``conname`` is ``host(port)`` or the name of a listener in the network's address book;
    ``xmit_q_name`` applies to SDR; ``cluster`` to CLUSSDR/CLUSRCVR. ``batch_size`` is
    BATCHSZ (messages per batch, MQ's default 50).
    """

    name: str
    chltype: ChannelType
    conname: str = ""
    xmit_q_name: str = ""
    cluster: str = ""
    description: str = ""
    batch_size: int = 50

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = int(value) if isinstance(value, enum.IntEnum) else value
        return out

    def with_changes(self, **changes: Any) -> ChannelDef:
        return replace(self, **changes)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChannelDef:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["chltype"] = ChannelType(kwargs["chltype"])
        return cls(**kwargs)


@dataclass(slots=True)
class ObjectCatalogue:
    """All object definitions of one queue manager, keyed by (upper-case) name."""

    qmgr: QMgrAttrs
    queues: dict[str, QueueDef] = field(default_factory=dict)
    channels: dict[str, ChannelDef] = field(default_factory=dict)

    @property
    def q_mgr_name(self) -> str:
        return self.qmgr.name

    def get(self, name: str) -> QueueDef | None:
        return self.queues.get(name)


def check_object_name(name: str, what: str = "queue") -> str | None:
    """Why ``name`` is not a valid MQ object name, or None (MQ naming rules)."""
    if not name:
        return f"{what} name is blank"
    if len(name) > Q_NAME_LENGTH:
        return f"{what} name {name!r} is longer than {Q_NAME_LENGTH} characters"
    bad = sorted(set(name) - _NAME_CHARS)
    if bad:
        return f"{what} name {name!r} contains characters MQ does not allow: {''.join(bad)!r}"
    return None


def default_queues() -> list[QueueDef]:
    """The objects every queue manager has that the gateway's engine needs."""
    return [
        QueueDef(DEAD_LETTER_QUEUE, QType.LOCAL, description="dead-letter queue",
                 default_persistent=True, max_depth=MAX_MAXDEPTH // 1000),
        QueueDef(BROKER_CONTROL_QUEUE, QType.LOCAL, description="broker control queue",
                 default_persistent=True),
        QueueDef(BROKER_DEFAULT_STREAM, QType.LOCAL, description="default stream",
                 default_persistent=True),
        QueueDef(BROKER_ADMIN_STREAM, QType.LOCAL, description="broker admin stream",
                 default_persistent=True),
        QueueDef(ADMIN_COMMAND_QUEUE, QType.LOCAL, description="command server queue"),
        QueueDef(CLUSTER_TRANSMIT_QUEUE, QType.LOCAL, description="cluster transmission queue",
                 usage=Usage.TRANSMISSION, default_persistent=True),
        QueueDef(CLUSTER_COMMAND_QUEUE, QType.LOCAL, description="cluster command queue",
                 default_persistent=True),
        QueueDef(CLUSTER_REPOSITORY_QUEUE, QType.LOCAL, description="cluster repository",
                 default_persistent=True),
    ]


def new_catalogue(q_mgr_name: str) -> ObjectCatalogue:
    cat = ObjectCatalogue(QMgrAttrs(name=q_mgr_name, dead_letter_q_name=DEAD_LETTER_QUEUE))
    for q in default_queues():
        cat.queues[q.name] = q
    return cat
