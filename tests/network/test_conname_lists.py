"""Channels' CONNAME lists: MQSC checks a list at DEFINE (a clear error for a malformed
one, not a channel retrying forever), and what a list or an address-book entry of
several listeners resolves to, in the order a sender channel tries them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.mq.embedded.channels import AddressBook, ChannelError, conname_addresses
from gateway.mq.embedded.qmgr import EmbeddedQueueManager


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
