"""Where a worker's time and device memory go, per request kind: a diagnostic for the guard.

With ``KERNELARC_WORKER_PROFILE`` set in the guard's environment to a folder, every worker
runs each request under ``cProfile`` (one profile per request kind, summed over the worker's
life) and writes the heaviest functions of each to ``profile.txt`` in its own folder when it
exits; the pool copies that file into the folder before removing the worker's
(``pool.WorkerPool``). On a GPU it also notes the device memory each request kind leaves
allocated and reserved, and at exit which lines of code hold the blocks still allocated
(torch's allocator history): what a persistent worker carries from one verdict to the next.
Profiling slows the worker: use it to find costs, never to measure them.
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
HOLDERS = 20  # lines of code shown for the memory held at exit


class RequestProfiler:
    def __init__(self, cuda: bool = False) -> None:
        self._by_op: dict[str, cProfile.Profile] = {}
        self._counts: dict[str, int] = {}
        self._cuda = cuda
        self._held: dict[str, tuple[int, int, int]] = {}  # op -> (allocated, reserved, peak reserved) after it
        if cuda:
            import torch

            torch.cuda.memory._record_memory_history(max_entries=200_000)

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
            if self._cuda:
                import torch

                self._held[op] = (
                    torch.cuda.memory_allocated(),
                    torch.cuda.memory_reserved(),
                    torch.cuda.max_memory_reserved(),
                )

    def report(self) -> str:
        parts = []
        for op, prof in sorted(self._by_op.items()):
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            parts.append(f"=== {op}: {self._counts[op]} request(s), {stats.total_tt:.3f} s\n")  # type: ignore[attr-defined]
            stats.sort_stats("cumulative").print_stats(TOP)
            parts.append(buf.getvalue())
        if self._cuda:
            parts.append(self._memory_report())
        return "".join(parts)

    def _memory_report(self) -> str:
        import torch

        mib = 1 << 20
        lines = ["=== device memory after the last request of each kind (MiB): allocated, reserved, peak reserved\n"]
        for op, (alloc, reserved, peak) in sorted(self._held.items()):
            lines.append(f"{op:>16} {alloc / mib:10.1f} {reserved / mib:10.1f} {peak / mib:10.1f}\n")
        by_site: dict[str, int] = {}
        for seg in torch.cuda.memory._snapshot().get("segments", []):
            for block in seg.get("blocks", []):
                if block.get("state") != "active_allocated":
                    continue
                site = _holder(block.get("frames") or [])
                by_site[site] = by_site.get(site, 0) + int(block.get("size", 0))
        lines.append(
            f"=== still allocated at exit: {sum(by_site.values()) / mib:.1f} MiB, by the line that allocated it\n"
        )
        for site, size in sorted(by_site.items(), key=lambda kv: -kv[1])[:HOLDERS]:
            lines.append(f"{size / mib:10.1f}  {site}\n")
        return "".join(lines)

    def write(self, folder: Path) -> None:
        (folder / FILE_NAME).write_text(self.report())


def _holder(frames: list[dict[str, Any]]) -> str:
    """The innermost Python frame of the project's own code (or of a problem's reference),
    where torch's frames would all name the same few allocation functions."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and "/triton/" not in name and name.endswith(".py"):
            return f"{'/'.join(name.rsplit('/', 3)[-3:])}:{f.get('line')} {f.get('name')}"
    return "(no Python frame)" if not frames else f"{frames[0].get('filename')}:{frames[0].get('line')}"
