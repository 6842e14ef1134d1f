"""Fixtures of the neighbour tests: a network of embedded queue managers in-process.

Same as ``tests/network/conftest.py``'s ``make_network`` (pytest fixtures do not cross
sibling folders); the lead may move both to ``tests/support``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.mq.embedded.network import Network
from gateway.mq.embedded.topology import topology_from_dict
from tests.network.network_helpers import NetworkFactory


@pytest.fixture
def make_network(tmp_path: Path) -> NetworkFactory:
    @asynccontextmanager
    async def factory(mqsc: dict[str, str]) -> AsyncIterator[Network]:
        topo = topology_from_dict(
            {"queue_managers": {name: {"mqsc": text} for name, text in mqsc.items()}}, tmp_path
        )
        net = Network(topo, tmp_path / "data")
        try:
            await net.start()
            yield net
        finally:
            await net.stop()

    return factory
