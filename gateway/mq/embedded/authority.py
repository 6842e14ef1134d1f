"""Object authority of the embedded queue manager: the gateway's own queues.

Why: ``SYSTEM.MQGW.*`` queues (a sink's backlog ``SYSTEM.MQGW.SINK.<instance>``) hold
what the gateway sends on with its own authority. On IBM MQ an administrator keeps other
users off them with object authorities (``setmqaut``); the embedded queue manager has
no authority records, so it applies the one rule that matters: only the gateway's own
OS user (and root, MQ's ``mqm``) may open them, whatever name leads there (an alias, a
remote definition). A message arriving over a receiving channel for a queue only the
gateway itself puts to (a sink backlog, ``SYSTEM.MQGW.SINK.*``) goes to the dead-letter
queue with MQRC_NOT_AUTHORIZED (2035), as IBM MQ's receiving MCA does when its user may
not put there (other ``SYSTEM.MQGW.*`` queues, such as ``mqgw migrate``'s reply queue,
are answered over channels).
"""

from __future__ import annotations

from gateway.mq.embedded.name_resolution import Resolution
from gateway.mq.port import MQError
from gateway.wire.reasons import Reason

__all__ = [
    "GATEWAY_PUT_ONLY_PREFIX",
    "GATEWAY_QUEUE_PREFIX",
    "check_gateway_queues",
    "is_gateway_put_only",
    "is_gateway_queue",
]

#: Queues only the gateway's own user may open (docs/security.md).
GATEWAY_QUEUE_PREFIX = "SYSTEM.MQGW."
#: Queues nothing but the gateway itself puts to: no channel delivers there.
GATEWAY_PUT_ONLY_PREFIX = "SYSTEM.MQGW.SINK."


def is_gateway_queue(name: str) -> bool:
    """Whether ``name`` is one of the gateway's own queues."""
    return name.strip().upper().startswith(GATEWAY_QUEUE_PREFIX)


def is_gateway_put_only(name: str) -> bool:
    """Whether only the gateway itself puts to ``name`` (a sink backlog)."""
    return name.strip().upper().startswith(GATEWAY_PUT_ONLY_PREFIX)


def check_gateway_queues(name: str, resolution: Resolution | None, user: str) -> None:
    """MQError 2035 when ``name``, or where it resolves (every definition followed, the
    local queue, the transmission queue), is a gateway queue: ``user`` is not the
    gateway's own."""
    names = [name]
    if resolution is not None:
        names += [*resolution.path, resolution.xmit_q_name or resolution.q_name]
    for n in names:
        if n and is_gateway_queue(n):
            raise MQError(
                Reason.NOT_AUTHORIZED,
                f"user {user} is not authorised to {n.strip()}: the gateway's own queues "
                f"({GATEWAY_QUEUE_PREFIX}*) are its user's only",
            )
