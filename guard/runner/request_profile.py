"""Where a worker's time goes, per request kind: a diagnostic for the guard's own speed.

With ``KERNELARC_WORKER_PROFILE`` set in the guard's environment to a folder, every worker
runs each request under ``cProfile`` (one profile per request kind, summed over the worker's
life) and writes the heaviest functions of each to ``profile.txt`` in its own folder when it
exits; the pool copies that file into the folder before removing the worker's
(``pool.WorkerPool``). Profiling slows the worker: use it to find costs, never to measure them.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "KERNELARC_WORKER_PROFILE"
FILE_NAME = "profile.txt"
TOP = 30


class RequestProfiler:
    def __init__(self) -> None:
        self._by_op: dict[str, cProfile.Profile] = {}
        self._counts: dict[str, int] = {}

    def handle(
        self, op: str, handle: Callable[[dict[str, Any]], dict[str, Any]], msg: dict[str, Any]
    ) -> dict[str, Any]:
        prof = self._by_op.setdefault(op, cProfile.Profile())
        self._counts[op] = self._counts.get(op, 0) + 1
        prof.enable()
        try:
            return handle(msg)
        finally:
            prof.disable()

    def report(self) -> str:
        parts = []
        for op, prof in sorted(self._by_op.items()):
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            parts.append(f"=== {op}: {self._counts[op]} request(s), {stats.total_tt:.3f} s\n")  # type: ignore[attr-defined]
            stats.sort_stats("cumulative").print_stats(TOP)
            parts.append(buf.getvalue())
        return "".join(parts)

    def write(self, folder: Path) -> None:
        (folder / FILE_NAME).write_text(self.report())
