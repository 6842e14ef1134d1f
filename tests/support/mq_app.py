"""An MQ application as its own process, owning one queue-manager node of a topology.

Why: the request/reply tests (tests/network/test_request_reply.py) need MQ services on
other queue managers of the network, answering the way MQ applications do, in processes
of their own (each embedded store is locked by the process that owns it, and the
embedded listener speaks only the channel protocol, so an application cannot connect
from elsewhere). ``serve`` runs the node (listener, channels, repository manager — the
same :class:`~gateway.mq.embedded.network.Network` as ``python -m
gateway.mq.embedded.network``) plus an echo responder on each ``--queue``::

    python -m tests.support.mq_app serve TOPOLOGY --qm QMA --queue SVC.QUOTE

Echo responder: gets each message under syncpoint; a message with a ReplyToQ gets a
REPLY whose body is ``ECHO_PREFIX + body``, put to ReplyToQ @ ReplyToQMgr through the
queue manager's name resolution (put1), CorrelId/MsgId per the request's report options
(MQ's rules: CorrelId = request CorrelId with PASS_CORREL_ID, else request MsgId; MsgId =
request MsgId with PASS_MSG_ID, else new; remaining Expiry with PASS_DISCARD_AND_EXPIRY),
Persistence/Priority/Format/CCSID/Encoding of the request; then commits. A reply that
cannot be put (unknown queue manager, ...) is logged and the request committed, as a
simple application would; a message without ReplyToQ is consumed silently. It prints
``READY <QM> 127.0.0.1 <port>`` once the node listens and ``REPLIED <queue> <request
msgid hex> <reply correlid hex> <request report> <ReplyToQ>@<ReplyToQMgr> <request body hex>``
per reply, so
a test can wait for it and check the request the gateway put.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.topology import TopologyError, load_topology
from gateway.mq.port import GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.constants import MsgType, Report
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

log = logging.getLogger("mq_app")

#: What the echo responder puts in front of the request body.
ECHO_PREFIX = b"echo:"
#: MQMD ids the queue manager replaces (MQMI_NONE / MQCI_NONE).
NO_ID = bytes(24)


def reply_md(request: MQMD) -> MQMD:
    """The MQMD an MQ application puts its reply with, per the request's report options."""
    report = request.report
    correl_id = request.correl_id if report & Report.PASS_CORREL_ID else request.msg_id
    msg_id = request.msg_id if report & Report.PASS_MSG_ID else NO_ID
    expiry = request.expiry if report & Report.PASS_DISCARD_AND_EXPIRY else -1
    return MQMD(
        msg_type=MsgType.REPLY, correl_id=correl_id, msg_id=msg_id, expiry=expiry,
        persistence=request.persistence, priority=request.priority,
        format=request.format, coded_char_set_id=request.coded_char_set_id,
        encoding=request.encoding,
    )


async def echo(qm: EmbeddedQueueManager, queue: str, stop: asyncio.Event) -> None:
    """The echo responder on ``queue`` until ``stop`` is set."""
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        while not stop.is_set():
            try:
                msg: Message = await h.get(GetOptions(wait_ms=200, syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    continue
                raise
            md = msg.md
            if md.reply_to_q:
                out = reply_md(md)
                try:
                    put = await conn.put1(md.reply_to_q, out, ECHO_PREFIX + msg.body,
                                          PutOptions(syncpoint=True),
                                          q_mgr_name=md.reply_to_q_mgr)
                except MQError as exc:
                    log.warning("reply to %s@%s failed: %s", md.reply_to_q,
                                md.reply_to_q_mgr, exc)
                else:
                    print(f"REPLIED {queue} {md.msg_id.hex()} {put.correl_id.hex()} "
                          f"{md.report} {md.reply_to_q}@{md.reply_to_q_mgr} {msg.body.hex()}",
                          flush=True)
            await conn.commit()


async def serve(topology_path: Path, name: str, queues: list[str]) -> None:
    topology = load_topology(topology_path)
    if name not in topology.queue_managers:
        raise TopologyError(str(topology_path), f"no queue manager {name} in the topology")
    network = Network(topology)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await network.start([name])
        node = network[name]
        print(f"READY {name} 127.0.0.1 {node.port}", flush=True)
        tasks = [asyncio.create_task(echo(node.qm, q, stop)) for q in queues]
        await stop.wait()
        await asyncio.gather(*tasks)
    finally:
        await network.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.mq_app")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("serve", help="a queue-manager node with echo responders")
    p.add_argument("topology", type=Path)
    p.add_argument("--qm", required=True)
    p.add_argument("--queue", action="append", default=[], help="serve this queue")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        asyncio.run(serve(args.topology, args.qm, args.queue))
    except (TopologyError, MQError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
