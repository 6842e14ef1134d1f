"""Free TCP ports on the loopback interface for the local services, safe across processes.

A port handed to a service that binds it later can be taken in between. Two rules close
that window, for this process and for every other one that picks ports here (parallel
pytest-xdist workers, a second test suite, ``mqgw devstack up``):

- ports come from *below* the kernel's ephemeral range (``net.ipv4.ip_local_port_range``),
  so the kernel never gives one to another socket binding port 0 or connecting out;
- a chosen port is *reserved* until this process exits by a UDP socket bound to the same
  number on the same address (TCP and UDP ports are separate, so the service can still bind
  it): a process picking ports here skips every number whose UDP twin is bound. The kernel
  drops the reservation when the process ends, however it ends: nothing to clean up.

A port is also probed with a plain TCP bind (no ``SO_REUSEADDR``), so one that something
listens on, or that still has connections in TIME_WAIT, is skipped. Where the ephemeral
range leaves no room below it, the kernel picks (bind to 0), as before; callers still treat
a bind failure in a service log as a reason to retry with fresh ports.
"""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

LOOPBACK = "127.0.0.1"

#: Lowest port handed out: above the registered ports most local services use.
RANGE_LOW = 20000
#: Reservations one process keeps (a UDP socket each); past this the oldest is released.
MAX_RESERVATIONS = 4096
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_lock = threading.Lock()
_reserved: deque[socket.socket] = deque()
_next: dict[str, int] = {}


def _range_high() -> int:
    """First port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _try_reserve(host: str, port: int) -> socket.socket | None:
    """The UDP reservation of ``port`` if no other process holds it and TCP can bind it."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind((host, port))
    except OSError:
        udp.close()
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError:
        udp.close()
        return None
    return udp


def _reserve(host: str) -> int:
    low, high = RANGE_LOW, _range_high()
    if high - low < 1000:
        return _kernel_port(host)
    span = high - low
    with _lock:
        # Each process starts at a random place, then walks the range: processes rarely
        # meet, and when they do the reservation decides.
        start = _next.get(host)
        if start is None:
            start = random.SystemRandom().randrange(span)
        for step in range(span):
            offset = (start + step) % span
            udp = _try_reserve(host, low + offset)
            if udp is None:
                continue
            _next[host] = (offset + 1) % span
            _reserved.append(udp)
            while len(_reserved) > MAX_RESERVATIONS:
                _reserved.popleft().close()
            return low + offset
    return _kernel_port(host)


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listens on, reserved for this process."""
    return _reserve(host)


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct free ports, each reserved for this process."""
    return [_reserve(host) for _ in range(count)]


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
