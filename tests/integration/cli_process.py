"""A command (``pyserve ...`` or a script) running in a subprocess, its output read line by line with time bounds."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

# One address line Serve prints (or logs) once it serves.
SERVING_LINE = re.compile(
    r"pyserve serving HTTP on http://127\.0\.0\.1:(\d+), gRPC on 127\.0\.0\.1:(\d+), "
    r"metrics on http://127\.0\.0\.1:(\d+)/metrics"
)


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without PYSERVE_* variables (they would change the server's config), plus extra."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYSERVE_")}
    env.update(extra)
    return env


# Every listener on a free port.
FREE_PORTS = ("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")


def pyserve_command(*args: str) -> list[str]:
    """The ``pyserve`` command line, run with this interpreter."""
    return [sys.executable, "-m", "pyserve.cli", *args]


class RunningCommand:
    """A subprocess with stdout and stderr merged; ``close()`` (or leaving its ``with`` block) kills it if it still
    runs."""

    def __enter__(self) -> RunningCommand:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __init__(self, command: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env if env is not None else clean_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.lines: list[str] = []
        self._ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self._queue.put(raw.decode(errors="replace").rstrip("\n"))
        self._queue.put(None)

    @property
    def output(self) -> str:
        """Everything read so far."""
        self._drain(0)
        return "\n".join(self.lines)

    def _drain(self, timeout: float) -> bool:
        """Move queued lines into ``lines``, waiting up to ``timeout`` for the first; False at end of output."""
        if self._ended:
            return False
        try:
            line = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return True
        while True:
            if line is None:
                self._ended = True
                return False
            self.lines.append(line)
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return True

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float = 60.0) -> re.Match[str]:
        """The first output line matching ``pattern``; fails with the output when none comes in time."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for line in self.lines[seen:]:
                match = regex.search(line)
                if match:
                    return match
            seen = len(self.lines)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line matching {regex.pattern!r} within {timeout} s; output:\n{self.output}")
            if not self._drain(min(remaining, 0.5)) and seen == len(self.lines):
                # The output ended and no line matched.
                raise AssertionError(
                    f"exited with {self.process.wait()} before a line matched {regex.pattern!r}:\n{self.output}"
                )

    def finish(self, timeout: float = 30.0) -> int:
        """Wait for the exit status (killing the process and failing when it does not exit in time)."""
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"still running after {timeout} s; output:\n{self.output}") from None
        self._reader.join(10)
        self._drain(0)
        return status

    def terminate(self) -> None:
        """Send SIGTERM once."""
        self.process.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Kill the process if it still runs and release its pipe."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
