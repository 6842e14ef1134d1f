"""How messages on SYSTEM.CLUSTER.TRANSMIT.QUEUE are keyed to the channel that takes them.

Why a module of its own: the put that queues a message (the queue handle), the network
that starts cluster-sender channels and the repository manager all need the same key,
and none of them should import another for it. IBM MQ likewise keys that queue by
channel (CorrelId).
"""

from __future__ import annotations

import hashlib

from gateway.mq.embedded.objects import CLUSTER_COMMAND_QUEUE


def cluster_correl_id(q_mgr_name: str, lane: str = "") -> bytes:
    """CorrelId of a message on SYSTEM.CLUSTER.TRANSMIT.QUEUE for cluster member
    ``q_mgr_name``: the auto-defined cluster-sender to that member gets by it (IBM MQ
    likewise keys that queue by channel). ``lane`` separates repository traffic."""
    return hashlib.sha256(f"{lane}>{q_mgr_name}".encode()).digest()[:24]


def cluster_lane(q_name: str) -> str:
    """Repository traffic travels on its own cluster-sender lane, so a partial repository
    learning names while it receives a batch is never queued behind that batch."""
    return "CMD" if q_name == CLUSTER_COMMAND_QUEUE else ""
