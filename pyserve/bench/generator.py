"""The load generator: several client processes (``worker``) driven together, their records gathered in one place.

A load level is split between the processes (concurrency shared out, a rate divided). The parent reads every
process's chunks as they come; ``collect(until)`` waits until every process has reported past ``until`` and hands
over what ended before it, so a window holds every request that ended in it, whichever process sent it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from pyserve.bench.settings import LoadLevel
from pyserve.bench.windows import Collected, Records
from pyserve.bench.worker import Chunk, Exit, Failed, Idle, Load, Ready, Target, worker_main
from pyserve.errors import ClientError

FLUSH_INTERVAL_S = 0.1
# How long past a moment the parent waits for every process to report it before giving up on them.
REPORT_GRACE_S = 15.0
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 5.0


@dataclasses.dataclass
class _Client:
    process: BaseProcess
    connection: Connection
    reported_at: float = 0.0
    cpu_s: float = 0.0
    cpu_mark: tuple[float, float] | None = None  # (moment, CPU seconds) at the last usage reading
    idle: bool = False
    ready: bool = False


class LoadGenerator:
    """``processes`` client processes, started on ``__enter__`` and stopped on ``__exit__``."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._clients: list[_Client] = []
        self._pending: list[Records] = []
        self._messages: dict[int, dict[int, str]] = {}
        self._late = 0
        self._held = 0

    def __enter__(self) -> LoadGenerator:
        context = multiprocessing.get_context("spawn")
        try:
            for index in range(self.processes):
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=worker_main,
                    args=(child_end, FLUSH_INTERVAL_S),
                    name=f"pyserve-bench-client-{index}",
                    daemon=True,
                )
                process.start()
                child_end.close()
                self._clients.append(_Client(process, parent_end))
            self._await_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every client process (asked first, then terminated)."""
        for client in self._clients:
            with contextlib.suppress(OSError):
                client.connection.send(Exit())
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        for client in self._clients:
            client.process.join(max(deadline - time.monotonic(), 0.0))
            if client.process.is_alive():
                client.process.terminate()
                client.process.join(EXIT_TIMEOUT_S)
            client.connection.close()
        self._clients = []

    def target(self, target: Target) -> None:
        """Point every process at a server (stopping any load); returns once every one has taken it."""
        for client in self._clients:
            client.ready = False
        self._send_all(target)
        self._await_ready()

    def start(self, level: LoadLevel) -> None:
        """Start ``level``, shared between the processes; records from before are dropped."""
        for client, share in zip(self._clients, level.split(len(self._clients)), strict=True):
            client.connection.send(Load(share))
        self._pending = []

    def idle(self) -> None:
        """Stop the load and wait until every process has finished its requests in flight."""
        self._send_all(Idle())
        for client in self._clients:
            client.idle = False
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(client.idle for client in self._clients):
            self._read(deadline)
        self._pending = []

    def collect(self, until: float) -> Collected:
        """Wait until every process has reported past ``until``; what ended before it, and how the processes fared
        since the last collect."""
        deadline = until + REPORT_GRACE_S
        while any(client.reported_at < until for client in self._clients):
            self._read(deadline)
        records, rest = Records.concatenate(self._pending).ending_before(until)
        self._pending = [rest]
        collected = Collected(records, self._cpu_use(), self._late, self._held)
        self._late = self._held = 0
        return collected

    def messages(self) -> dict[int, str]:
        """Every error message by the code ``collect``'s records carry (codes are made unique across processes)."""
        return {code: text for table in self._messages.values() for code, text in table.items()}

    # internals ------------------------------------------------------------------------------------------------------

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(client.ready for client in self._clients):
            self._read(deadline)

    def _send_all(self, command: Any) -> None:
        for client in self._clients:
            client.connection.send(command)

    def _read(self, deadline: float) -> None:
        """Read whatever the processes sent, waiting up to ``deadline`` for something."""
        left = deadline - time.monotonic()
        if left <= 0:
            silent = [index for index, client in enumerate(self._clients) if not client.process.is_alive()]
            what = f"client process {silent[0]} died" if silent else "the client processes stopped reporting"
            raise ClientError(f"bench: {what}")
        ready = wait([client.connection for client in self._clients], timeout=min(left, 1.0))
        for connection in ready:
            index = next(i for i, client in enumerate(self._clients) if client.connection is connection)
            self._receive(index)

    def _receive(self, index: int) -> None:
        client = self._clients[index]
        connection = client.connection
        try:
            while connection.poll():
                message = connection.recv()
                if isinstance(message, Chunk):
                    self._take(index, message)
                elif isinstance(message, Idle):
                    client.idle = True
                elif isinstance(message, Ready):
                    client.ready = True
                elif isinstance(message, Failed):
                    raise ClientError(f"bench: client process {index} failed: {message.error}")
        except (EOFError, OSError):
            raise ClientError(f"bench: client process {index} exited unexpectedly") from None

    def _take(self, index: int, chunk: Chunk) -> None:
        client = self._clients[index]
        client.reported_at = chunk.flushed_at
        client.cpu_s = chunk.cpu_s
        if client.cpu_mark is None:
            client.cpu_mark = (chunk.flushed_at, chunk.cpu_s)
        self._late += chunk.late
        self._held += chunk.held
        # Codes are per process: offset them so that they are unique.
        offset = index << 20
        if chunk.messages:
            table = self._messages.setdefault(index, {})
            table.update({offset + code: text for code, text in chunk.messages.items()})
        codes = np.frombuffer(chunk.codes, dtype=np.int32).astype(np.int64)
        codes[codes != 0] += offset
        self._pending.append(
            Records(np.frombuffer(chunk.starts, dtype=np.float64), np.frombuffer(chunk.ends, dtype=np.float64), codes)
        )

    def _cpu_use(self) -> float:
        busiest = 0.0
        for client in self._clients:
            mark = client.cpu_mark
            if mark is not None and client.reported_at > mark[0]:
                busiest = max(busiest, (client.cpu_s - mark[1]) / (client.reported_at - mark[0]))
            client.cpu_mark = (client.reported_at, client.cpu_s)
        return busiest
