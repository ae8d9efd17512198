"""Timing loops shared by the candidate and trusted workers, so a candidate and its
baselines are measured the same way. Inputs rotate over several sets so that nothing can be
cached between calls, and L2 is flushed (a buffer of twice its size is written, persisting
lines are reset) before every iteration.

GPU, preferred ("cuda-graph+cupti"): after an eager warm-up, the call on each input set is
captured in a CUDA graph; the timed loop enqueues flush, start event, graph replay, end
event without synchronising, so the host runs ahead. The loop runs under CUPTI (through
torch.profiler) and each iteration's latency is the span of the device work of its graph
launch, from the first kernel's start to the last one's end, whatever stream it ran on. On
the H200 this was the difference between a run-to-run spread of 2.5-52% (events around the
replay: they also count the graph's launch on the device and have 0.5 us resolution) and
0.01-0.7% (docs/benchmarks.md, benchmarks/spread_probe.py). Launch overhead is left out, as
SOL-ExecBench's CUPTI timing leaves it out.

"cuda-graph": the same loop timed by the events alone, when CUPTI gives no usable record
(the reason is kept with the result as ``cupti_error``).

GPU, when the call cannot be captured (host synchronisation inside, unjoined streams):
"cuda-events+host-sync": per iteration, synchronize the whole device, read the host clock,
record a start event, call, record an end event, synchronize, read the host clock; the
latency is ``max(event time, host time - sync overhead)``, so work on another stream still
counts. Launch overhead is included in this mode.

CPU ("host-clock"): the same loop with the host clock and a flush of twice the last-level
cache.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from .common import is_torch_result_tuple
from .harness import T


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summarize(samples_ms: list[float]) -> dict:
    s = sorted(samples_ms)
    median = statistics.median(s)
    q1, q3 = _percentile(s, 0.25), _percentile(s, 0.75)
    sigma = (q3 - q1) / 1.349 if q3 > q1 else (statistics.pstdev(s) if len(s) > 1 else 0.0)
    se_median = 1.2533 * sigma / math.sqrt(len(s))
    return {
        "median_ms": median,
        "mean_ms": statistics.fmean(s),
        "min_ms": s[0],
        "p10_ms": _percentile(s, 0.10),
        "p90_ms": _percentile(s, 0.90),
        "iqr_ms": q3 - q1,
        "n": len(s),
        "rel_se": se_median / median if median > 0 else 0.0,
    }


def last_level_cache_bytes() -> int:
    best = 0
    for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = p.read_text().strip().upper()
        mult = 1024 * 1024 if text.endswith("M") else 1024 if text.endswith("K") else 1
        try:
            best = max(best, int(text.rstrip("KM")) * mult)
        except ValueError:
            continue
    return best or 32 * 1024 * 1024


class Timer:
    """One per worker: holds the flush buffer and the calibrated sync overhead."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda:
            props = torch.cuda.get_device_properties(self.device)
            self.flush_bytes = 2 * int(props.L2_cache_size)
        else:
            self.flush_bytes = 2 * last_level_cache_bytes()
        self.flush_buf = T.empty(self.flush_bytes // 4, dtype=torch.int32, device=self.device)
        self._reset_l2 = _persisting_l2_reset() if self.is_cuda else None
        self.overhead_ms = 0.0
        if self.is_cuda:
            self.overhead_ms = self._calibrate()
            self._start_cupti()

    def _start_cupti(self) -> None:
        """CUPTI's first session in a process takes about a second: pay it here, not in a verdict."""
        try:
            with T.profile(activities=[T.cuda_activity]):
                T.zero_(self.flush_buf[:1024])
                T.cuda_sync()
        except Exception:  # noqa: BLE001 - measure() falls back to events and says why
            pass

    # -- one iteration ----------------------------------------------------------------
    def _flush(self) -> None:
        T.zero_(self.flush_buf)
        if self._reset_l2 is not None:
            self._reset_l2()

    def _iteration(self, call: Callable[[], object], keep: bool = False):
        self._flush()
        if self.is_cuda:
            start, end = T.cuda_event(enable_timing=True), T.cuda_event(enable_timing=True)
            T.cuda_sync()
            h0 = T.perf_counter()
            T.event_record(start)
            out = call()
            T.event_record(end)
            T.cuda_sync()
            h1 = T.perf_counter()
            event_ms = T.event_elapsed(start, end)
            host_ms = (h1 - h0) * 1e3
            latency = max(event_ms, host_ms - self.overhead_ms)
            return latency, event_ms, host_ms, (out if keep else None)
        h0 = T.perf_counter()
        out = call()
        h1 = T.perf_counter()
        ms = (h1 - h0) * 1e3
        return ms, ms, ms, (out if keep else None)

    def _calibrate(self) -> float:
        gaps = []
        for _ in range(30):
            _, ev, host, _ = self._iteration(lambda: None)
            gaps.append(host - ev)
        return statistics.median(gaps[5:])

    # -- CUDA graphs ------------------------------------------------------------------------
    def _capture(self, call: Callable[[int], object], n_sets: int):
        """One graph per input set, or ``(None, reason)`` when the call cannot be captured."""
        try:
            side = torch.cuda.Stream(device=self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for k in range(n_sets):
                    call(k)
            torch.cuda.current_stream(self.device).wait_stream(side)
            T.cuda_sync()
            graphs = []
            for k in range(n_sets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = call(k)
                graphs.append((g, out))
            for g, _ in graphs:  # one replay each before timing
                T.graph_replay(g)
            T.cuda_sync()
            return graphs, None
        except Exception as exc:  # noqa: BLE001 - any failure means: time it eagerly
            try:
                T.cuda_sync()
            except Exception:  # noqa: BLE001
                pass
            return None, f"{type(exc).__name__}: {exc}"[:300]

    def _graph_loop(self, graphs, iters: int, audit: set, keep_audit) -> list[float]:
        starts = [T.cuda_event(enable_timing=True) for _ in range(iters)]
        ends = [T.cuda_event(enable_timing=True) for _ in range(iters)]
        T.cuda_sync()
        for it in range(iters):
            g, out = graphs[it % len(graphs)]
            if it in audit:
                # untimed: the static outputs still hold an earlier replay's results; poisoned,
                # a replay that skips its work is caught by the check of what it leaves
                poison_outputs(out)
            self._flush()
            T.event_record(starts[it])
            T.graph_replay(g)
            T.event_record(ends[it])
            if it in audit:  # untimed: after the end event, before the next flush
                keep_audit(it, it % len(graphs), out)
        T.cuda_sync()
        return [T.event_elapsed(s, e) for s, e in zip(starts, ends)]

    def _graph_loop_cupti(self, graphs, iters: int, audit: set, keep_audit):
        """The graph loop under CUPTI: (event samples, CUPTI spans or None, why not, device
        activities per replay)."""
        try:
            prof = T.profile(activities=[T.cuda_activity])
            prof.start()
        except Exception as exc:  # noqa: BLE001 - no CUPTI: the events still time the loop
            return self._graph_loop(graphs, iters, audit, keep_audit), None, f"profiler: {exc}"[:200], []
        try:
            events = self._graph_loop(graphs, iters, audit, keep_audit)
        finally:
            try:
                prof.stop()
                stop_error = None
            except Exception as exc:  # noqa: BLE001 - the profiler's failure, not the candidate's
                stop_error = f"profiler stop: {type(exc).__name__}: {exc}"[:200]
        if stop_error:
            return events, None, stop_error, []
        try:
            spans, why, kernels = graph_launch_spans(prof.profiler.kineto_results.events(), iters)
        except Exception as exc:  # noqa: BLE001
            spans, why, kernels = None, f"reading CUPTI records: {type(exc).__name__}: {exc}"[:200], []
        if spans is not None:
            # a replay's device work lies inside its event window; if not, the records are not ours
            if T.median(spans) > 1.05 * T.median(events) + 1e-3:
                spans, why = None, (f"CUPTI median {T.median(spans):.4f} ms exceeds the event "
                                    f"median {T.median(events):.4f} ms")
        return events, spans, why, kernels

    # -- a whole measurement -------------------------------------------------------------
    def measure(
        self,
        call: Callable[[int], object],
        n_sets: int,
        min_iters: int,
        max_iters: int,
        target_time_s: float,
        warmup_time_s: float,
        audit_at: tuple[int, ...] = (),
        on_audit: Callable[[int, int, object], None] | None = None,
        max_time_s: float | None = None,
        use_graphs: bool = True,
        use_cupti: bool = True,
        outputs_of: Callable[[int], object] | None = None,
    ) -> dict:
        """Time ``call(set_index)``. ``on_audit(iteration, set_index, outputs)`` is called,
        untimed, after the chosen iterations so their outputs can be checked; before those
        iterations the outputs they will write (``outputs_of(set_index)`` for buffers the
        caller owns, a graph's static outputs) are poisoned."""
        # Warm-up: every input set at least once (compilation, autotuning, caches).
        warm_ms, i = [], 0
        budget_end = T.perf_counter() + warmup_time_s
        while i < n_sets or T.perf_counter() < budget_end:
            lat, _, _, _ = self._iteration(lambda k=i % n_sets: call(k))
            warm_ms.append(lat)
            i += 1
            if i >= max(n_sets, 1000):
                break
        est = max(statistics.median(warm_ms[-max(1, len(warm_ms) // 2):]), 1e-4)
        iters = int(min(max_iters, max(min_iters, math.ceil(target_time_s * 1e3 / est))))
        audit = set(a % iters for a in audit_at)
        graph_error = None
        if self.is_cuda and use_graphs:
            graphs, graph_error = self._capture(call, n_sets)
            if graphs is not None:
                kept: list[tuple[int, int, object]] = []

                def keep(it: int, k: int, out) -> None:
                    # copy on the stream, so later replays cannot overwrite what is checked
                    kept.append((it, k, _copy_outputs(out)))

                kernels: list[int] = []
                if use_cupti:
                    event_samples, spans, cupti_error, kernels = self._graph_loop_cupti(graphs, iters, audit, keep)
                else:
                    event_samples, spans, cupti_error = self._graph_loop(graphs, iters, audit, keep), None, "off"
                for it, k, out in kept:
                    if on_audit is not None:
                        on_audit(it, k, out)
                stats = summarize(spans if spans is not None else event_samples)
                stats.update(
                    event_median_ms=statistics.median(event_samples),
                    method="cuda-graph+cupti" if spans is not None else "cuda-graph",
                    n_sets=n_sets, flush_bytes=self.flush_bytes, warmup_iters=len(warm_ms),
                    planned_iters=iters, eager_warmup_median_ms=est, off_stream_suspect=False,
                )
                if spans is None:
                    stats["cupti_error"] = cupti_error
                else:  # kernels, copies and memsets per call: fusion shows here
                    stats["device_ops_per_call"] = statistics.median(kernels)
                return stats
        lat_ms, ev_ms, host_ms = [], [], []
        t_begin = T.perf_counter()
        for it in range(iters):
            # A very slow kernel (or Triton's CPU interpreter) stops early, with at least 5
            # iterations; the count is reported with the result.
            if max_time_s is not None and it >= 5 and T.perf_counter() - t_begin > max_time_s:
                break
            k = it % n_sets
            want = it in audit
            if want and outputs_of is not None:
                poison_outputs(outputs_of(k))  # untimed, as in the graph loop
            lat, ev, host, out = self._iteration(lambda k=k: call(k), keep=want)
            lat_ms.append(lat)
            ev_ms.append(ev)
            host_ms.append(host)
            if want and on_audit is not None:
                on_audit(it, k, out)
            del out
        stats = summarize(lat_ms)
        stats.update(
            event_median_ms=statistics.median(ev_ms),
            host_median_ms=statistics.median(host_ms),
            sync_overhead_ms=self.overhead_ms,
            method="cuda-events+host-sync" if self.is_cuda else "host-clock",
            n_sets=n_sets,
            flush_bytes=self.flush_bytes,
            warmup_iters=len(warm_ms),
            planned_iters=iters,
        )
        if graph_error:
            stats["graph_error"] = graph_error
        # Work that escapes the event window (another stream, host work after the last
        # launch) shows as host time well above event time; say so in the result.
        stats["off_stream_suspect"] = bool(
            self.is_cuda and stats["host_median_ms"] - self.overhead_ms > 1.2 * stats["event_median_ms"] + 0.01
        )
        return stats


def graph_launch_spans(events, iters: int) -> tuple[list[float] | None, str | None, list[int]]:
    """Per graph launch, in launch order: from its first device activity's start to its last
    one's end, in ms, and how many device activities it had. CUPTI gives a graph's kernels,
    copies and memsets the correlation id of the ``cudaGraphLaunch`` call that ran them.
    ``(None, why, [])`` unless every one of the ``iters`` launches is found with device work."""
    launches = sorted(
        (e for e in events if _is_host(e) and e.name().startswith("cudaGraphLaunch")),
        key=lambda e: e.start_ns(),
    )
    if len(launches) != iters:
        return None, f"{len(launches)} graph launches recorded for {iters} replays", []
    ids = {e.correlation_id() for e in launches}
    spans: dict[int, tuple[int, int]] = {}
    counts: dict[int, int] = {}
    for e in events:
        if _is_host(e) or e.correlation_id() not in ids or e.duration_ns() <= 0:
            continue
        counts[e.correlation_id()] = counts.get(e.correlation_id(), 0) + 1
        lo, hi = e.start_ns(), e.start_ns() + e.duration_ns()
        if e.correlation_id() in spans:
            a, b = spans[e.correlation_id()]
            lo, hi = min(lo, a), max(hi, b)
        spans[e.correlation_id()] = (lo, hi)
    if len(spans) != iters:
        return None, f"device activity found for {len(spans)} of {iters} graph launches", []
    order = [e.correlation_id() for e in launches]
    return [(spans[c][1] - spans[c][0]) / 1e6 for c in order], None, [counts[c] for c in order]


def _is_host(event) -> bool:
    return str(event.device_type()).rsplit(".", 1)[-1] == "CPU"


def _copy_outputs(out):
    """A stream-ordered copy of a graph's static outputs (tensor, tuple, list or dict). Exact
    types only: a subclass would run the candidate's code here, inside the timed loop."""
    kind = T.type(out)
    if kind is T.tensor_type:
        return T.clone(out)
    if kind is tuple or kind is list:
        return kind(_copy_outputs(o) for o in out)
    if kind is dict:
        return {k: _copy_outputs(v) for k, v in out.items()}
    if is_torch_result_tuple(kind):
        return tuple(_copy_outputs(o) for o in out)
    return out


def poison_outputs(out) -> None:
    """Fill output tensors with values a correct result is unlikely to hold (NaN for floats;
    -1, 255 or True for integers and booleans), so outputs a call did not write are found by
    the check. For integers and booleans that is likely, not certain: an output whose right
    value is all -1 (or all True) would not show a skipped write."""
    kind = T.type(out)
    if kind is T.tensor_type:
        if out.is_floating_point() or out.is_complex():
            T.fill_(out, float("nan"))
        elif out.dtype == torch.bool:
            T.fill_(out, True)
        elif out.dtype == torch.uint8:
            T.fill_(out, 255)
        else:
            T.fill_(out, -1)
    elif kind is tuple or kind is list or is_torch_result_tuple(kind):
        for o in out:
            poison_outputs(o)
    elif kind is dict:
        for o in out.values():
            poison_outputs(o)


def _persisting_l2_reset():
    """cudaCtxResetPersistingL2Cache through cuda-python, when it is installed."""
    try:
        from cuda.bindings import runtime as cudart  # type: ignore
    except ImportError:
        try:
            from cuda import cudart  # type: ignore
        except ImportError:
            return None
    fn = getattr(cudart, "cudaCtxResetPersistingL2Cache", None)
    return (lambda: fn()) if fn else None
