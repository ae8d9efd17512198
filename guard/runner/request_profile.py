"""Where a worker's time and device memory go, per request kind: a diagnostic for the guard.

With ``KERNELARC_WORKER_PROFILE`` set in the guard's environment to a folder, every worker
runs each request under ``cProfile`` (one profile per request kind, summed over the worker's
life) and writes the heaviest functions of each to ``profile.txt`` in its own folder when it
exits; the pool copies that file into the folder before removing the worker's
(``pool.WorkerPool``). On a GPU it also notes the device memory each request kind leaves
allocated and reserved, at exit which lines of code hold the blocks still allocated (torch's
allocator history): what a persistent worker carries from one verdict to the next, and, for
each request kind, which lines held the blocks live at its highest point (``peak_holders``,
the history replayed): what a verdict's peak memory is made of.
Profiling slows the worker: use it to find costs, never to measure them.
"""

from __future__ import annotations

import bisect
import cProfile
import io
import pstats
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ENV = "KERNELARC_WORKER_PROFILE"


def enabled() -> bool:
    """Whether the guard's workers profile their requests (told by ``--profile``, never by
    their environment, which keeps nothing of the guard's)."""
    import os

    return bool(os.environ.get(ENV))


FILE_NAME = "profile.txt"
TOP = 30
HOLDERS = 20  # lines of code shown for the memory held at exit


class RequestProfiler:
    def __init__(self, cuda: bool = False) -> None:
        self._by_op: dict[str, cProfile.Profile] = {}
        self._counts: dict[str, int] = {}
        self._cuda = cuda
        self._held: dict[str, tuple[int, int, int]] = {}  # op -> (allocated, reserved, peak reserved) after it
        self._spans: list[tuple[str, float, float]] = []  # (op, start, end) in the allocator history's microseconds
        if cuda:
            import torch

            torch.cuda.memory._record_memory_history(max_entries=200_000)

    def handle(
        self, op: str, handle: Callable[[dict[str, Any]], dict[str, Any]], msg: dict[str, Any]
    ) -> dict[str, Any]:
        prof = self._by_op.setdefault(op, cProfile.Profile())
        self._counts[op] = self._counts.get(op, 0) + 1
        start = time.time() * 1e6
        prof.enable()
        try:
            return handle(msg)
        finally:
            prof.disable()
            self._spans.append((op, start, time.time() * 1e6))
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
        traces = torch.cuda.memory._snapshot().get("device_traces") or [[]]
        for op, (peak, holders) in sorted(peak_holders(traces[0], self._spans).items()):
            lines.append(
                f"=== {op}: {peak / mib:.1f} MiB allocated at its highest point, by the line that allocated it\n"
            )
            lines += [f"{size / mib:10.1f}  {site}\n" for site, size in holders[:HOLDERS]]
        return "".join(lines)

    def write(self, folder: Path) -> None:
        (folder / FILE_NAME).write_text(self.report())


def peak_holders(
    trace: list[dict[str, Any]], spans: list[tuple[str, float, float]]
) -> dict[str, tuple[int, list[tuple[str, int]]]]:
    """Replay the allocator's history (torch's ``device_traces``: alloc and free events with
    their stacks and ``time_us``): for each request kind, the most bytes live at once while a
    request of that kind ran (from the span ``(kind, start_us, end_us)`` an allocation falls
    in; "outside requests" otherwise), and the blocks live then, summed by the line that
    allocated them, largest first. Blocks allocated before the history's first event are not
    seen: the history is a ring of its last entries."""
    spans = sorted(spans, key=lambda s: s[1])
    starts = [a for _, a, _ in spans]

    def kind_at(when: float) -> str:
        i = bisect.bisect_right(starts, when) - 1
        return spans[i][0] if i >= 0 and when <= spans[i][2] else "outside requests"

    # first pass: each kind's peak and the event that reached it; the second replays the
    # history to those events only (a copy of the live blocks at every new peak was quadratic)
    peaks: dict[str, tuple[int, int]] = {}
    for i, total in _replay(trace):
        if total is not None:
            kind = kind_at(float(trace[i].get("time_us", 0)))
            if total > peaks.get(kind, (0, -1))[0]:
                peaks[kind] = (total, i)
    at = {i: kind for kind, (_, i) in peaks.items()}
    out = {}
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for i, event in enumerate(trace):
        _apply(live, event)
        if i in at:
            by_site: dict[str, int] = {}
            for size, frames in live.values():
                site = _holder(frames)
                by_site[site] = by_site.get(site, 0) + size
            out[at[i]] = (peaks[at[i]][0], sorted(by_site.items(), key=lambda kv: -kv[1]))
    return out


def _apply(live: dict[int, tuple[int, list[dict[str, Any]]]], event: dict[str, Any]) -> int:
    """One allocator event on the live blocks (address -> size, allocating stack): the bytes it
    adds (negative for a free, 0 for anything else). The stack is named (``_holder``) only for
    the blocks live at a peak, not for every allocation."""
    action, addr = event.get("action"), int(event.get("addr", 0))
    if action == "alloc":
        size = int(event.get("size", 0))
        live[addr] = (size, event.get("frames") or [])
        return size
    if action in ("free_requested", "free_completed") and addr in live:
        return -live.pop(addr)[0]
    return 0


def _replay(trace: list[dict[str, Any]]) -> Iterator[tuple[int, int | None]]:
    """Each event's index with the live bytes after it when it is an allocation, else None."""
    live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    total = 0
    for i, event in enumerate(trace):
        total += _apply(live, event)
        yield i, (total if event.get("action") == "alloc" else None)


def _holder(frames: list[dict[str, Any]]) -> str:
    """The innermost Python frame of the project's own code (or of a problem's reference),
    where torch's frames would all name the same few allocation functions."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and "/triton/" not in name and name.endswith(".py"):
            return f"{'/'.join(name.rsplit('/', 3)[-3:])}:{f.get('line')} {f.get('name')}"
    return "(no Python frame)" if not frames else f"{frames[0].get('filename')}:{frames[0].get('line')}"
