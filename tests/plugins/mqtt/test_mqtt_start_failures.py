"""A failed MQTT start leaves nothing behind (socket closed, background task ended), and
a SUBACK failure code is reported as a non-retriable config/ACL error. Uses a minimal
fake MQTT 3.1.1 server on 127.0.0.1 (no Mosquitto needed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from plugins.mqtt.config import MqttConfig
from plugins.mqtt.connection import MqttConnection, MqttConnectionError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return header, await reader.readexactly(length)


class FakeServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.closed_by_client = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await self.handler(reader, writer)
            while await reader.read(1024):
                pass
            self.closed_by_client.set()
        writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def server_factory() -> AsyncIterator[Callable[[Handler], Awaitable[FakeServer]]]:
    servers: list[FakeServer] = []

    async def make(handler: Handler) -> FakeServer:
        fake = FakeServer(handler)
        fake.server = await asyncio.start_server(fake._serve, "127.0.0.1", 0)
        servers.append(fake)
        return fake

    yield make
    for fake in servers:
        assert fake.server is not None
        fake.server.close()
        await fake.server.wait_closed()


def _connection(port: int) -> MqttConnection:
    config = MqttConfig(protocol="3.1.1", port=port, connect_timeout=0.5)
    return MqttConnection(
        config, "cid", on_message=lambda _: None, subscriptions=lambda: [("a/#", 1)]
    )


async def test_start_without_connack_closes_socket_and_task(
    server_factory: Callable[[Handler], Awaitable[FakeServer]],
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_packet(reader)  # CONNECT, never answered

    fake = await server_factory(silent)
    conn = _connection(fake.port)
    with pytest.raises(MqttConnectionError):
        await conn.start()
    assert conn._misc_task is not None and conn._misc_task.done()
    assert conn._client.socket() is None
    await asyncio.wait_for(fake.closed_by_client.wait(), 5)


async def test_suback_failure_is_non_retriable_and_closes(
    server_factory: Callable[[Handler], Awaitable[FakeServer]],
) -> None:
    async def refuse_subscribe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_packet(reader)  # CONNECT
        writer.write(bytes([0x20, 0x02, 0x00, 0x00]))  # CONNACK accepted
        await writer.drain()
        header, body = await _read_packet(reader)
        assert header & 0xF0 == 0x80  # SUBSCRIBE
        writer.write(bytes([0x90, 0x03, body[0], body[1], 0x80]))  # SUBACK failure
        await writer.drain()

    fake = await server_factory(refuse_subscribe)
    conn = _connection(fake.port)
    with pytest.raises(MqttConnectionError, match="refused the subscriptions") as info:
        await conn.start()
    assert info.value.reason == 0x80  # non-zero: the instance reports it non-retriable
    assert conn._misc_task is not None and conn._misc_task.done()
    assert conn._client.socket() is None
    await asyncio.wait_for(fake.closed_by_client.wait(), 5)


async def test_no_suback_is_a_connection_error_not_a_bare_timeout(
    server_factory: Callable[[Handler], Awaitable[FakeServer]],
) -> None:
    async def ignore_subscribe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_packet(reader)
        writer.write(bytes([0x20, 0x02, 0x00, 0x00]))
        await writer.drain()
        await _read_packet(reader)  # SUBSCRIBE, never answered

    fake = await server_factory(ignore_subscribe)
    conn = _connection(fake.port)
    with pytest.raises(MqttConnectionError, match="SUBACK") as info:
        await conn.start()
    assert info.value.reason == 0  # retriable
    assert conn._client.socket() is None
    await asyncio.wait_for(fake.closed_by_client.wait(), 5)
