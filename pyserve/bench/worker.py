"""A load-generating process: one asyncio loop (uvloop when installed) sending requests and recording each answer.

The process says ``Ready`` once it is up. The parent (``generator``) sends commands over a pipe: ``Target`` (where
and what to send; answered ``Ready``), ``Load`` (start a load
level's share: a closed loop of N concurrent senders, or an open loop at R requests/s), ``Idle`` (stop and let the
requests in flight finish), ``Exit``. Every ``flush_interval_s`` the process sends back a ``Chunk``: when each
request started and ended (``time.monotonic``, one clock for every process on the machine), an error code per
request (0: success), the error messages new since the last chunk, the CPU time the process has used (so the
parent can tell when the generator itself is the bottleneck), and, in an open loop, how many requests went out
late because the process could not keep the schedule, or held because ``max_in_flight`` requests were waiting.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from pyserve.bench.senders import UNREACHABLE, Sender, make_sender
from pyserve.bench.settings import LoadLevel
from pyserve.client.model import InferRequest, parse_url
from pyserve.client.tls import ClientTls

# A request sent this much after its scheduled time counts as late (open loop); one that waited for a free slot
# (max_in_flight reached: the server fell behind) counts as held instead.
LATE_S = 0.002
# After a failure to connect, a closed-loop sender waits this long before trying again, rather than spinning.
RETRY_PAUSE_S = 0.01
# How long Idle waits for the requests in flight before cancelling them.
DRAIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class Target:
    """Where requests go and what they carry (sent to every process once per server)."""

    url: str
    tls: ClientTls | None
    requests: Sequence[InferRequest]
    headers: Mapping[str, str]
    request_timeout_s: float
    max_in_flight: int
    distribution: str
    seed: int


@dataclasses.dataclass(frozen=True)
class Load:
    """Start this process's share of a load level (None: stay idle)."""

    level: LoadLevel | None


@dataclasses.dataclass(frozen=True)
class Idle:
    """Stop sending; answer ``Idle`` once the requests in flight are done."""


@dataclasses.dataclass(frozen=True)
class Exit:
    """Close the connections and end the process."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """What a process recorded since its last chunk. ``starts``/``ends`` are float64 and ``codes`` int32 arrays as
    bytes, one entry per answered request; ``messages`` maps each new error code to its message."""

    flushed_at: float
    cpu_s: float
    starts: bytes
    ends: bytes
    codes: bytes
    messages: Mapping[int, str]
    late: int
    held: int


@dataclasses.dataclass(frozen=True)
class Ready:
    """The process is up, or has taken a ``Target``: the load it is given next starts at once."""


@dataclasses.dataclass(frozen=True)
class Failed:
    """The process failed; ``error`` says how."""

    error: str


def worker_main(connection: Connection, flush_interval_s: float) -> None:
    """Entry point of a client process."""
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_Worker(connection, flush_interval_s).run())
    except Exception as exc:  # reported to the parent, which raises it there
        with contextlib.suppress(OSError):
            connection.send(Failed(f"{type(exc).__name__}: {exc}"))
    finally:
        loop.close()
        connection.close()


class _Worker:
    def __init__(self, connection: Connection, flush_interval_s: float) -> None:
        self._connection = connection
        self._flush_interval_s = flush_interval_s
        self._commands: asyncio.Queue[Any] = asyncio.Queue()
        self._target: Target | None = None
        self._sender: Sender | None = None
        self._generation = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight = 0
        self._slot_freed = asyncio.Event()
        self._starts = array.array("d")
        self._ends = array.array("d")
        self._codes = array.array("i")
        self._codes_of: dict[str, int] = {}
        self._new_messages: dict[int, str] = {}
        self._late = 0
        self._held = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self._connection.fileno(), self._read_commands)
        flusher = asyncio.create_task(self._flush_every_interval())
        self._connection.send(Ready())
        try:
            while True:
                command = await self._commands.get()
                if isinstance(command, Target):
                    await self._stop_load()
                    await self._close_sender()
                    self._target = command
                    address = parse_url(command.url, command.tls)
                    self._sender = make_sender(address, command.requests, command.headers, command.request_timeout_s)
                    self._connection.send(Ready())
                elif isinstance(command, Load):
                    await self._stop_load()
                    if command.level is not None:
                        self._start_load(command.level)
                elif isinstance(command, Idle):
                    await self._stop_load()
                    self._flush()
                    self._connection.send(Idle())
                else:
                    break
        finally:
            loop.remove_reader(self._connection.fileno())
            flusher.cancel()
            await self._stop_load(drain_s=0.0)
            await self._close_sender()

    def _read_commands(self) -> None:
        try:
            while self._connection.poll():
                self._commands.put_nowait(self._connection.recv())
        except (EOFError, OSError):
            self._commands.put_nowait(Exit())  # the parent is gone

    # load -----------------------------------------------------------------------------------------------------------

    def _start_load(self, level: LoadLevel) -> None:
        generation = self._generation
        if level.concurrency is not None:
            for slot in range(level.concurrency):
                self._spawn(self._closed_loop(slot, generation))
        else:
            self._spawn(self._open_loop(level.request_rate or 0.0, generation))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_load(self, drain_s: float = DRAIN_S) -> None:
        self._generation += 1
        self._slot_freed.set()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=drain_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _closed_loop(self, slot: int, generation: int) -> None:
        assert self._sender is not None and self._target is not None
        sender, count = self._sender, len(self._target.requests)
        index = slot % count
        while self._generation == generation:
            started = time.monotonic()
            error = await sender.send(index)
            self._record(started, time.monotonic(), error)
            index = (index + 1) % count
            if error is not None and error.startswith(UNREACHABLE):
                await asyncio.sleep(RETRY_PAUSE_S)

    async def _open_loop(self, rate: float, generation: int) -> None:
        assert self._target is not None
        target = self._target
        draws = random.Random(target.seed)
        poisson = target.distribution == "poisson"
        count = len(target.requests)
        index = 0
        due = time.monotonic()
        held = False
        while self._generation == generation:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            if self._in_flight >= target.max_in_flight:
                held = True
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            if held:
                self._held += 1
                held = False
            elif now - due > LATE_S:
                self._late += 1
            self._spawn(self._one(index))
            index = (index + 1) % count
            due += draws.expovariate(rate) if poisson else 1.0 / rate

    async def _one(self, index: int) -> None:
        assert self._sender is not None
        self._in_flight += 1
        try:
            started = time.monotonic()
            error = await self._sender.send(index)
            self._record(started, time.monotonic(), error)
        finally:
            self._in_flight -= 1
            self._slot_freed.set()

    def _record(self, started: float, ended: float, error: str | None) -> None:
        self._starts.append(started)
        self._ends.append(ended)
        if error is None:
            self._codes.append(0)
            return
        code = self._codes_of.get(error)
        if code is None:
            code = self._codes_of[error] = len(self._codes_of) + 1
            self._new_messages[code] = error
        self._codes.append(code)

    # reporting ------------------------------------------------------------------------------------------------------

    async def _flush_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval_s)
            self._flush()

    def _flush(self) -> None:
        chunk = Chunk(
            flushed_at=time.monotonic(),
            cpu_s=time.process_time(),
            starts=self._starts.tobytes(),
            ends=self._ends.tobytes(),
            codes=self._codes.tobytes(),
            messages=self._new_messages,
            late=self._late,
            held=self._held,
        )
        self._starts, self._ends, self._codes = array.array("d"), array.array("d"), array.array("i")
        self._new_messages, self._late, self._held = {}, 0, 0
        self._connection.send(chunk)

    async def _close_sender(self) -> None:
        if self._sender is not None:
            await self._sender.close()
            self._sender = None
