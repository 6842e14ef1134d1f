"""What one node says about itself for the network check: its queue manager, the
streams its broker services, the sinks subscribed to each, its neighbours and the MQ
definitions that route a put elsewhere (a running gateway answers it on ``/network``, behind
its metrics credentials).

Why pydantic: the check reads these from other processes, so every one is untrusted
input — names are length- and character-checked, every list and map is bounded, and a
view that breaks a rule is refused whole (the node is reported unreadable) rather than
half-believed.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "MAX_ITEMS",
    "NETWORK_PATH",
    "VIEW_VERSION",
    "MQView",
    "NeighbourView",
    "NodeView",
    "RemoteQueue",
]

VIEW_VERSION = 1
#: Where a gateway's metrics listener answers its view (behind the /metrics credentials).
NETWORK_PATH = "/network"
#: Most entries of any one list or map of a view (queues, streams, neighbours, ...); a
#: node with more says ``truncated`` and the check says it judged a part.
MAX_ITEMS = 5000
#: MQ object names: at most 48 characters of A-Z a-z 0-9 . / _ % (queue and queue-manager
#: names); anything else a node announces is refused, so no name can carry markup or
#: terminal control characters into the report.
_MQ_NAME = re.compile(r"[A-Za-z0-9._/%]{1,48}")
#: Plugin instance names and gateway ids: a little wider (configuration names).
_LABEL = re.compile(r"[A-Za-z0-9._:@/+-]{1,128}")


def _mq_name(value: str) -> str:
    if not _MQ_NAME.fullmatch(value):
        raise ValueError(f"not an MQ object name: {value[:60]!r}")
    return value


def _label(value: str) -> str:
    if not _LABEL.fullmatch(value):
        raise ValueError(f"not a plain name: {value[:60]!r}")
    return value


MQName = Annotated[str, AfterValidator(_mq_name)]
#: A blank or an MQ name (RNAME/RQMNAME/XMITQ may be blank).
MQNameOrBlank = Annotated[str, AfterValidator(lambda v: v if v == "" else _mq_name(v))]
Label = Annotated[str, AfterValidator(_label)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NeighbourView(_Strict):
    """One neighbour as this node's links hold it."""

    q_mgr: MQName
    #: mqpubsub, mqv7 or gateway
    kind: Literal["mqpubsub", "mqv7", "gateway"]
    #: the neighbour's role seen from this node: ``parent`` or ``child``
    role: Literal["parent", "child"]
    #: the link's state word (active, joining, refused, ...)
    state: Annotated[str, Field(max_length=32, pattern=r"^[a-z_-]*$")]
    #: the streams both sides support, as this node negotiated them
    streams: Annotated[list[MQName], Field(max_length=MAX_ITEMS)] = []


class RemoteQueue(_Strict):
    """A QREMOTE: a remote queue (RNAME set) or a queue-manager alias (RNAME blank)."""

    rname: MQNameOrBlank = ""
    rqmname: MQNameOrBlank = ""
    xmitq: MQNameOrBlank = ""


class MQView(_Strict):
    """The queue manager's definitions that decide where a put goes (the embedded queue
    manager; a node on IBM MQ has none and its routes are not checked)."""

    #: local queues other than transmission queues (SYSTEM.* left out)
    local_queues: Annotated[list[MQName], Field(max_length=MAX_ITEMS)] = []
    transmission_queues: Annotated[list[MQName], Field(max_length=MAX_ITEMS)] = []
    remote_queues: Annotated[dict[MQName, RemoteQueue], Field(max_length=MAX_ITEMS)] = {}
    #: alias queue -> its target queue
    alias_queues: Annotated[dict[MQName, MQNameOrBlank], Field(max_length=MAX_ITEMS)] = {}
    default_xmit_q: MQNameOrBlank = ""
    #: cluster queues of other members this queue manager's repository knows -> hosts
    cluster_queues: Annotated[
        dict[MQName, Annotated[list[MQName], Field(max_length=64)]], Field(max_length=MAX_ITEMS)
    ] = {}
    #: cluster queue managers (and queue-manager aliases) it can send to
    cluster_q_mgrs: Annotated[list[MQName], Field(max_length=MAX_ITEMS)] = []

    # the lists as sets, for the lookups of a check (a node may list thousands)
    @cached_property
    def local_set(self) -> frozenset[str]:
        return frozenset(self.local_queues)

    @cached_property
    def xmitq_set(self) -> frozenset[str]:
        return frozenset(self.transmission_queues)

    @cached_property
    def cluster_q_mgr_set(self) -> frozenset[str]:
        return frozenset(self.cluster_q_mgrs)


class NodeView(_Strict):
    """One node of the network as it describes itself."""

    version: int = VIEW_VERSION
    q_mgr: MQName
    gateway: Label = "?"
    #: streams the broker services (the admin stream left out)
    serviced: Annotated[list[MQName], Field(max_length=MAX_ITEMS)] = []
    #: stream -> the sink instances (plugins) subscribed to it here
    sinks: Annotated[
        dict[MQName, Annotated[list[Label], Field(max_length=256)]], Field(max_length=MAX_ITEMS)
    ] = {}
    neighbours: Annotated[list[NeighbourView], Field(max_length=MAX_ITEMS)] = []
    mq: MQView | None = None
    #: the node had more than MAX_ITEMS of something and sent a part
    truncated: bool = False
