"""The live display while a benchmark runs: the current step, and each window's throughput and latency as it ends.

On a terminal one line is rewritten in place and each finished step leaves a line behind; elsewhere (a log, a
pipe) every window is a line of its own. Everything goes to stderr, so stdout carries only the final table.
"""

from __future__ import annotations

import sys
from typing import TextIO

from pyserve.bench.settings import LoadLevel
from pyserve.bench.windows import Window

_CLEAR_LINE = "\r\x1b[K"


class Progress:
    """Writes progress lines to ``stream`` (None: nothing); ``live`` rewrites one line (default: on a terminal)."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self._stream = stream
        self._live = bool(stream is not None and (stream.isatty() if live is None else live))
        self._prefix = ""

    @classmethod
    def to_stderr(cls) -> Progress:
        """Progress on stderr, live when it is a terminal."""
        return cls(sys.stderr)

    def step(self, index: int, total: int | None, level: LoadLevel, context: str = "") -> None:
        """A step begins (warming up); ``context`` goes before it (tune's configuration), ``total`` may be unknown."""
        counter = f"[{index}/{total}]" if total is not None else f"[{index}]"
        self._prefix = f"{context}{counter} {level.label()}"
        self._show(f"{self._prefix}: warming up", keep=False)

    def window(self, count: int, limit: int, window: Window, rows_per_request: int, stable: bool) -> None:
        """A window ended."""
        p50, p99 = window.percentile_us(50), window.percentile_us(99)
        latency = "no success" if p50 is None or p99 is None else f"p50 {p50 / 1000:.2f} ms  p99 {p99 / 1000:.2f} ms"
        errors = f"  errors {window.failures}" if window.failures else ""
        state = "stable" if stable else ("not stable yet" if count < limit else "not stable")
        throughput = window.requests_per_s * rows_per_request
        line = f"{self._prefix}: window {count}/{limit}  {throughput:,.1f} infer/s  {latency}{errors}  ({state})"
        self._show(line, keep=not self._live)

    def step_done(self, summary: str) -> None:
        """A step ended: its one-line summary stays."""
        self._show(f"{self._prefix}: {summary}", keep=True)

    def note(self, text: str) -> None:
        """A line that stays, such as a warning about the measurement."""
        self._show(text, keep=True)

    def _show(self, line: str, keep: bool) -> None:
        stream = self._stream
        if stream is None:
            return
        if self._live:
            stream.write(_CLEAR_LINE + line + ("\n" if keep else ""))
        elif keep:
            stream.write(line + "\n")
        stream.flush()
