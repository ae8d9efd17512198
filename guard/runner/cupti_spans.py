"""CUPTI's records (through torch.profiler) read into one span per timed call: the device
work a call launched, from its first activity's start to its last one's end, whatever stream
ran it (``timing`` times a graph replay or an eager call by these)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any


def graph_launch_spans(events: Iterable[Any], iters: int) -> tuple[list[float] | None, str | None, list[int]]:
    """Per graph launch, in launch order: from its first device activity's start to its last
    one's end, in ms, and how many device activities it had. CUPTI gives a graph's kernels,
    copies and memsets the correlation id of the ``cudaGraphLaunch`` call that ran them.
    ``(None, why, [])`` unless every one of the ``iters`` launches is found with device work.
    One pass over the records, few calls on each: tens of thousands of them per workload."""
    is_host = _HostTest()
    launches: list[tuple[int, int]] = []  # (start, correlation id) of each cudaGraphLaunch
    device: list[tuple[int, int, int]] = []  # (correlation id, start, duration) of device work
    for e in events:
        if is_host(e):
            if e.name().startswith("cudaGraphLaunch"):
                launches.append((e.start_ns(), e.correlation_id()))
        else:
            d = e.duration_ns()
            if d > 0:
                device.append((e.correlation_id(), e.start_ns(), d))
    if len(launches) != iters:
        return None, f"{len(launches)} graph launches recorded for {iters} replays", []
    launches.sort()
    spans: dict[int, list[int]] = {c: [] for _, c in launches}
    for c, start, d in device:
        found = spans.get(c)
        if found is None:
            continue
        if found:
            found[0], found[1] = min(found[0], start), max(found[1], start + d)
            found[2] += 1
        else:
            found.extend((start, start + d, 1))
    if sum(1 for v in spans.values() if v) != iters:
        n = sum(1 for v in spans.values() if v)
        return None, f"device activity found for {n} of {iters} graph launches", []
    order = [spans[c] for _, c in launches]
    return [(t - s) / 1e6 for s, t, _ in order], None, [k for _, _, k in order]


class _HostTest:
    """Whether a record is a host (API) record, its device type's text read once per type."""

    def __init__(self) -> None:
        self._known: dict[object, bool] = {}

    def __call__(self, event: Any) -> bool:
        kind = event.device_type()
        host = self._known.get(kind)
        if host is None:
            host = self._known[kind] = str(kind).rsplit(".", 1)[-1] == "CPU"
        return host


MARKER_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel


def marked_call_spans(events: Iterable[Any], iters: int) -> tuple[list[float] | None, str | None]:
    """Per eager call, in order: from the first device activity's start to the last one's end,
    in ms, of the activities launched between the two marker kernels around the call. CUPTI
    numbers API calls in the order they are made (correlation ids), so an activity whose id
    lies between the markers' was launched by the call, on whatever stream.
    ``(None, why)`` unless every call is found with device work."""
    is_host = _HostTest()
    device = [e for e in events if not is_host(e) and e.duration_ns() > 0]
    markers = sorted(e.correlation_id() for e in device if MARKER_KERNEL in e.name())
    if len(markers) != 2 * iters:
        return None, f"{len(markers)} markers recorded for {iters} eager calls"
    bounds = [(markers[2 * i], markers[2 * i + 1]) for i in range(iters)]
    spans: list[list[int] | None] = [None] * iters
    for e in device:
        c = e.correlation_id()
        i = bisect.bisect_right(markers, c) - 1  # the last marker launched before this activity
        if i < 0 or i % 2 or c == markers[i]:
            continue
        lo, hi = bounds[i // 2]
        if not lo < c < hi:
            continue
        s, t = e.start_ns(), e.start_ns() + e.duration_ns()
        cur = spans[i // 2]
        spans[i // 2] = [s, t] if cur is None else [min(cur[0], s), max(cur[1], t)]
    found = [x for x in spans if x is not None]
    if len(found) != iters:
        return None, f"no device activity found for {iters - len(found)} of {iters} eager calls"
    return [(t - s) / 1e6 for s, t in found], None
