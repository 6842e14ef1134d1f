"""The sink's wait for its records' acknowledgements (``plugins.kafka.sink._outcomes``)
gives what ``asyncio.gather(..., return_exceptions=True)`` gives, in order; cancelled, it
leaves the futures to end by themselves and reads their outcomes (no broker needed)."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaTimeoutError
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.kafka import KafkaPluginConfig
from plugins.kafka.mapping import OutboundRecord
from plugins.kafka.sink import KafkaSink, _outcomes, _Suspects


@settings(max_examples=60, deadline=None)
@given(
    endings=st.lists(st.sampled_from(["result", "error", "cancel"]), min_size=1, max_size=8),
    order=st.randoms(use_true_random=False),
    settled_before=st.integers(0, 8),
)
def test_outcomes_are_gathers_results_in_order(
    endings: list[str], order: object, settled_before: int
) -> None:
    async def run() -> tuple[list[object], list[object]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[object]] = [loop.create_future() for _ in endings]
        errors = [ValueError(f"record {i}") for i in range(len(endings))]

        def settle(i: int) -> None:
            if endings[i] == "result":
                futures[i].set_result(i)
            elif endings[i] == "error":
                futures[i].set_exception(errors[i])
            else:
                futures[i].cancel()

        indices = list(range(len(endings)))
        order.shuffle(indices)  # type: ignore[attr-defined]
        for i in indices[:settled_before]:
            settle(i)
        waiting = asyncio.ensure_future(_outcomes(futures))
        await asyncio.sleep(0)
        for i in indices[settled_before:]:
            settle(i)
            await asyncio.sleep(0)
        got = await waiting
        return got, await asyncio.gather(*futures, return_exceptions=True)

    got, expected = asyncio.run(run())
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        if isinstance(b, asyncio.CancelledError):
            assert isinstance(a, asyncio.CancelledError)
        else:
            assert a == b or a is b


async def test_a_cancelled_wait_leaves_the_futures_and_reads_their_outcomes() -> None:
    """A timeout ends the wait, not the sends (cancelling an acknowledgement never stops
    its send); an error that comes later is read, so asyncio logs no "Future exception
    was never retrieved" for a batch nobody awaits any more."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    futures: list[asyncio.Future[object]] = [loop.create_future() for _ in range(3)]
    futures[0].set_result("acked")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await _outcomes(futures)
    assert futures[0].result() == "acked"
    assert not futures[1].done() and not futures[2].done()
    futures[1].set_exception(RuntimeError("batch expired"))
    futures[2].set_result("acked late")
    await asyncio.sleep(0)  # the done-callbacks run
    futures.clear()
    gc.collect()
    assert unretrieved == []


class _SilentProducer:
    """A transactional producer whose records are never acknowledged in time."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[object]] = []

    async def begin_transaction(self) -> None:
        return None

    async def send(self, *_args: object, **_kwargs: object) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future


async def test_a_transaction_given_up_reads_its_acknowledgements_later() -> None:
    """Exactly-once: a transaction given up (the send timed out) leaves its records'
    futures to end by themselves; errors that come after are read (asyncio logs no
    "Future exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    config = KafkaPluginConfig(bootstrap_servers="127.0.0.1:9")
    sink = KafkaSink(config, config.outbound.router(), instance="k", gateway_id="gw")
    sink.ledger = SimpleNamespace(topic="eos")  # type: ignore[assignment]
    sink._round_keys = {0: b"key0", 1: b"key1"}
    producer = _SilentProducer()
    records = [(0, OutboundRecord("t", b"k", b"v0")), (1, OutboundRecord("t", b"k", b"v1"))]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await sink._produce_in_transaction(
                producer,  # type: ignore[arg-type]
                records,
                {},
                _Suspects(),
            )
    assert len(producer.futures) == 4  # two records, two committed-markers
    for future in producer.futures:
        future.set_exception(KafkaTimeoutError())
    await asyncio.sleep(0)  # the done-callbacks run
    producer.futures.clear()
    gc.collect()
    assert unretrieved == []
