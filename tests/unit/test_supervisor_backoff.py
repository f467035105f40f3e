"""The supervisor's restart delays: quick after a death, doubling through a start-up crash loop, starting over once
an instance did work."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from pyserve.core.supervisor import BACKOFF_MAX_S, BACKOFF_START_S, Supervisor, WorkerProcess


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    loop = asyncio.new_event_loop()
    try:
        yield Supervisor("ipc:///nowhere", "pyserve-test", 1 << 16, 1 << 20, lambda worker, status: None, loop)
    finally:
        loop.close()


def delays(supervisor: Supervisor, worker: WorkerProcess, worked: list[bool]) -> list[float]:
    return [supervisor.schedule_restart(worker, done) for done in worked]


def test_a_crash_loop_waits_twice_as_long_each_time_up_to_the_cap(supervisor: Supervisor) -> None:
    worker = WorkerProcess("m", 1, 0, "cpu", "/nowhere")
    found = delays(supervisor, worker, [False] * 12)
    assert found[:4] == [BACKOFF_START_S, 2 * BACKOFF_START_S, 4 * BACKOFF_START_S, 8 * BACKOFF_START_S]
    assert found[-1] == BACKOFF_MAX_S and max(found) == BACKOFF_MAX_S


def test_an_instance_that_answered_batches_restarts_at_once_again(supervisor: Supervisor) -> None:
    worker = WorkerProcess("m", 1, 0, "cpu", "/nowhere")
    delays(supervisor, worker, [False] * 6)
    # Killed after doing work (the OOM killer, an operator): no crash loop, so back within the first delay.
    assert delays(supervisor, worker, [True, True, True]) == [BACKOFF_START_S] * 3
    assert worker.restart_at is not None
