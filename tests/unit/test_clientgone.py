"""EndsWithClient: a block ends when its client's connection does, and only then."""

from __future__ import annotations

import asyncio

import pytest

from watchproxy.server.clientgone import EndsWithClient, already_lost


async def test_the_block_ends_where_it_waits_when_the_connection_is_lost() -> None:
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()
    upstream: asyncio.Future[None] = loop.create_future()  # never answers
    loop.call_soon(lost.set_result, None)
    reached_end = False
    with EndsWithClient(lost) as scope:
        await upstream
        reached_end = True
    assert scope.client_left and not reached_end
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation is left pending for later awaits


async def test_a_connection_lost_before_the_block_ends_it_at_its_first_wait() -> None:
    with EndsWithClient(already_lost()) as scope:
        await asyncio.sleep(3600)
    assert scope.client_left


async def test_a_block_that_finishes_first_is_not_touched_by_a_later_loss() -> None:
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with EndsWithClient(lost) as scope:
        await asyncio.sleep(0)
    lost.set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not scope.client_left


async def test_a_cancellation_from_elsewhere_still_propagates() -> None:
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler() -> None:
        with EndsWithClient(lost):
            await asyncio.sleep(3600)

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_shutdown_cancellation_at_the_same_time_still_propagates() -> None:
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()

    async def handler() -> None:
        with EndsWithClient(lost):
            await asyncio.sleep(3600)

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    lost.set_result(None)
    task.cancel()  # the owner cancels too: its cancellation is not swallowed
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_of_the_block_is_not_hidden() -> None:
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(ValueError, match="bad"), EndsWithClient(lost):
        raise ValueError("bad")


async def test_without_a_signal_the_block_just_runs() -> None:
    with EndsWithClient(None) as scope:
        await asyncio.sleep(0)
    assert not scope.client_left
