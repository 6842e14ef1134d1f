"""The sink's wait for its records' acknowledgements (``plugins.kafka.sink._outcomes``)
gives what ``asyncio.gather(..., return_exceptions=True)`` gives, in order; cancelled, it
leaves the futures to end by themselves and reads their outcomes (no broker needed)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.kafka.sink import _outcomes


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
