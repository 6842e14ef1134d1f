"""The embedded queue manager of ``mqgw run`` / ``mqgw broker`` as a network node.

Why: a broker joins neighbours on other queue managers through MQ itself (channels with
a transmission queue named after the neighbour, QM aliases, clusters; issue 13), so the
process that owns the embedded queue manager must also run what an MQ installation runs
next to it: the channel listener, the sender channels and the repository manager. That
is :class:`~gateway.mq.embedded.network.QueueManagerNode`; this module only turns the
gateway's settings (listener port, address book, MQSC text) into one and starts or stops
it, so ``mqgw run`` and ``mqgw broker`` share one way of doing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.mq.conname import MAX_ADDRESSES
from gateway.mq.embedded.channels import Address
from gateway.mq.embedded.network import QueueManagerNode
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.space import SpacePolicy

log = logging.getLogger(__name__)

__all__ = ["parse_address_book", "start_node"]


def parse_address_book(entries: Mapping[str, str]) -> dict[str, Address | list[Address]]:
    """``{"QM2": "127.0.0.1:14142"}`` -> ``{"QM2": ("127.0.0.1", 14142)}``; a list of
    listeners (the instances of a multi-instance node, tried in order),
    ``"hosta:14142,hostb:14142"``, -> a list of them. ValueError naming the entry when
    one is not ``host:port``, is empty or there are more than
    :data:`gateway.mq.conname.MAX_ADDRESSES`."""
    out: dict[str, Address | list[Address]] = {}
    for q_mgr, where in entries.items():
        parts = where.split(",")
        if len(parts) > MAX_ADDRESSES:
            raise ValueError(f"{q_mgr}: {len(parts)} addresses; at most {MAX_ADDRESSES}")
        listed: list[Address] = []
        for number, part in enumerate(parts, 1):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                if len(parts) == 1:
                    raise ValueError(f"{q_mgr}: {where!r} is not host:port (e.g. "
                                     "127.0.0.1:14141, or a list hosta:14141,hostb:14141)")
                what = "empty (a stray comma?)" if not part.strip() else repr(part.strip())
                raise ValueError(f"{q_mgr}: {where!r}: address {number} is {what}, not "
                                 "host:port")
            listed.append((host, int(port)))
        out[q_mgr] = listed[0] if len(listed) == 1 else listed
    return out


async def start_node(
    name: str,
    data_dir: Path,
    *,
    mqsc: str = "",
    listener_port: int | None = None,
    address_book: Mapping[str, str] | None = None,
    appl_name: str | None = None,
    before_channels: Callable[[EmbeddedQueueManager], None] | None = None,
    space: SpacePolicy | None = None,
) -> QueueManagerNode:
    """Open the queue manager ``name`` in ``data_dir`` with ``mqsc`` applied (every start;
    MQSCError naming the line), listen on 127.0.0.1 when ``listener_port`` is not None
    (0 = any free port), call ``before_channels`` (e.g. define missing stream queues, so
    the first message a channel brings finds them), then start its channels and
    repository manager. The caller stops it (``node.stop()``); on failure whatever was
    opened is closed again."""
    node = QueueManagerNode(
        name,
        data_dir,
        port=listener_port or 0,
        address_book=parse_address_book(address_book or {}),
        appl_name=appl_name,
        space=space,
    )
    try:
        node.prepare()  # opens the store; the MQSC runs here, not in node.open()
        if mqsc:
            node.qm.run_mqsc(mqsc, stop_on_error=True)
        if before_channels is not None:
            before_channels(node.qm)
        if listener_port is not None:
            await node.open()
            log.info("queue manager %s listens on 127.0.0.1:%d", name, node.port)
        await node.run()
    except BaseException:
        await node.stop()
        raise
    return node

