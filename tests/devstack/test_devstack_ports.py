"""Ports for local services are safe across processes (parallel pytest-xdist workers, a
second suite beside this one): out of the kernel's ephemeral range, so no port-0 bind or
outgoing connection gets one, and reserved for the process that took it, so no other
process that picks ports the same way gets it either — while the service can bind it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from gateway.devstack import ports
from gateway.devstack.ports import LOOPBACK, free_port, free_ports

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    return int(_EPHEMERAL.read_text().split()[0])


def _other_process(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


def test_ports_come_from_below_the_ephemeral_range_and_are_distinct() -> None:
    got = free_ports(50)
    assert len(set(got)) == 50
    assert all(ports.RANGE_LOW <= p < _ephemeral_low() for p in got), got


def test_a_port_handed_out_here_is_never_handed_to_another_process() -> None:
    mine = set(free_ports(200))
    # The other process starts its walk where this one did: without the reservation it
    # would be handed the same numbers.
    start = min(mine) - ports.RANGE_LOW
    theirs = _other_process(
        "from gateway.devstack import ports\n"
        f"ports._next['{LOOPBACK}'] = {start}\n"
        "print(*ports.free_ports(200))\n"
    )
    assert mine.isdisjoint(int(p) for p in theirs.split())


def test_the_service_can_bind_a_reserved_port_and_it_stays_reserved_after() -> None:
    port = free_port()
    with socket.create_server((LOOPBACK, port)) as server:
        assert server.getsockname()[1] == port
    # Closed again (a broker stopped for a restart): still this process's.
    out = _other_process(
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    s.bind(('{LOOPBACK}', {port})); print('free')\n"
        "except OSError:\n"
        "    print('reserved')\n"
    )
    assert out.strip() == "reserved"


def test_a_port_something_listens_on_is_skipped() -> None:
    nxt = free_port() + 1  # where this process's walk goes next
    try:
        listener = socket.create_server((LOOPBACK, nxt))
    except OSError:
        listener = None  # someone else's already: skipped all the more
    try:
        ports._next[LOOPBACK] = nxt - ports.RANGE_LOW
        assert free_port() != nxt
    finally:
        if listener is not None:
            listener.close()
