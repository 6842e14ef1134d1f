"""Channels' CONNAME lists: MQSC checks a list at DEFINE (a clear error for a malformed
one, not a channel retrying forever), and what a list or an address-book entry of
several listeners resolves to, in the order a sender channel tries them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from gateway.mq.embedded.channels import (
    AddressBook,
    ChannelError,
    ChannelSender,
    conname_addresses,
)
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.runtime.network_node import start_node


async def test_mqsc_checks_a_connection_list_at_define(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm1")
    try:
        ok = qm.run_mqsc("DEFINE QLOCAL(QM2) USAGE(XMITQ)\n"
                         "DEFINE CHANNEL(TO.HA) CHLTYPE(SDR) XMITQ(QM2) "
                         "CONNAME('hosta(1414), hostb(1415)')\n")
        assert all(r.ok for r in ok), [r.lines for r in ok]
        assert qm.catalogue.channels["TO.HA"].conname == "hosta(1414), hostb(1415)"
        cases = {
            "CONNAME('hosta(1414),,hostb(1415)')": "address 2 is empty",
            "CONNAME('hosta(1414),')": "address 2 is empty",
            "CONNAME('hosta(1414),hostb')": "address 2 'hostb' is not host(port)",
            "CONNAME('hosta(0)')": "not 1-65535",
            "CONNAME('" + ",".join(f"h{i}(1)" for i in range(9)) + "')": "at most 8",
            "CONNAME('" + "h" * 265 + "')": "at most 264",
        }
        for attr, says in cases.items():
            done = qm.run_mqsc(f"DEFINE CHANNEL(BAD) CHLTYPE(SDR) XMITQ(QM2) {attr}")[0]
            assert not done.ok and any(says in line for line in done.lines), (attr, done.lines)
        assert "BAD" not in qm.catalogue.channels
    finally:
        await qm.close()


def test_a_conname_resolves_to_the_addresses_to_try_in_order() -> None:
    book: AddressBook = {"HA": [("hosta", 1), ("hostb", 2)], "ONE": ("h", 3)}
    assert conname_addresses("hosta(1414), hostb(1415)", book) == [("hosta", 1414),
                                                                  ("hostb", 1415)]
    assert conname_addresses("h(9)", {}) == [("h", 9)]
    assert conname_addresses("ha", book) == [("hosta", 1), ("hostb", 2)]
    assert conname_addresses("ONE", book) == [("h", 3)]
    for bad in ("nowhere", "h(1),,g(2)"):
        with pytest.raises(ChannelError):
            conname_addresses(bad, book)


def _blackhole() -> tuple[socket.socket, list[socket.socket], int]:
    """A listener whose accept queue is full: the kernel drops further connection
    requests, as a host that is down does (no refusal, no answer)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    filled: list[socket.socket] = []
    for _ in range(8):  # more than the queue takes; the rest are left pending
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        filled.append(c)
    return server, filled, port


async def test_a_silent_address_of_the_list_is_passed_after_the_connect_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChannelSender, "CONNECT_TIMEOUT_S", 0.5)
    server, filled, silent = _blackhole()
    receiver = await start_node("QR", tmp_path / "qr", listener_port=0,
                                mqsc="DEFINE CHANNEL(QS.TO.QR) CHLTYPE(RCVR)\nDEFINE QLOCAL(IN)\n")
    sender = None
    try:
        sender = await start_node("QS", tmp_path / "qs", mqsc=(
            "DEFINE QLOCAL(QR) USAGE(XMITQ)\n"
            "DEFINE CHANNEL(QS.TO.QR) CHLTYPE(SDR) XMITQ(QR) "
            f"CONNAME('127.0.0.1({silent}),127.0.0.1({receiver.port})')\n"))
        channel = sender.senders[("MANUAL", "QS.TO.QR")]
        await asyncio.wait_for(channel.connected.wait(), 30)
        assert channel.address == f"127.0.0.1({receiver.port})"
    finally:
        if sender is not None:
            await sender.stop()
        await receiver.stop()
        for c in filled:
            c.close()
        server.close()
