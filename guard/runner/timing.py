"""Timing loops shared by the candidate and trusted workers, so a candidate and its
baselines are measured the same way.

Every timed iteration starts, outside the timed span, with fresh data (``replays``): the
inputs are refilled in place with a new seed's values, reachable outputs are overwritten with
random values; then L2 is flushed (a buffer of twice its size is written, persisting lines are
reset). After the timed span, the outputs are digested. ``arm`` warms up and plans; ``run``
times. The outside clock's loop, which the guard times with its own clock, is
``confirm.ConfirmLoop``.

GPU, preferred ("cuda-graph+cupti"): after an eager warm-up, the call on each input set is
captured in a CUDA graph, and the graph is kept only if a replay on fresh data gives the eager
call's result (a kernel launched on the legacy default stream is not captured; the call is then
timed eagerly, never accused). The loop enqueues refill, scramble, flush, start
event, replay, end event and digest without synchronising. It runs under CUPTI (through
torch.profiler) and each iteration's latency is the span of the device work of its graph
launch, from the first kernel's start to the last one's end, whatever stream it ran on, as
SOL-ExecBench's CUPTI timing and Nsight Compute measure it (launch overhead left out).

"cuda-graph": the same loop timed by the events alone, when CUPTI gives no usable record
(the reason is kept with the result as ``cupti_error``).

"cuda-events+cupti" (the call cannot be captured, or its graph does not hold its work, as
for a kernel launched on the legacy default stream): per iteration, synchronize the whole
device, read the host clock, queue padding long enough for the host to enqueue the call, a
marker kernel, a start event, the call, an end event, a marker kernel, synchronize, read the
host clock. The latency is the span of the device work launched between the two markers, on
whatever stream (``cupti_spans.marked_call_spans``), as for a graph launch; when the call spends more host
time than its span plus a launch's (``EAGER_LAUNCH_ALLOWANCE_MS``), the host figure counts:
``max(event time, host time - calibrated overhead)``. Without CUPTI ("cuda-events+host-sync"),
that host figure is the latency.

CPU ("host-clock"): the same loop with the host clock and a flush of at most 8 MB; a call's
time is the lesser of its wall and its process's CPU time, which a stall does not lengthen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cupti_spans import graph_launch_spans, marked_call_spans
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


# The CPU flush evicts the caches a small workload's inputs sit in (per-core L2 and a share of
# the last level); twice a large server's whole last-level cache (600 MB was seen) cost more
# than the call on every iteration, so it is capped.
CPU_FLUSH_CAP = 8 << 20

# An eager call is timed by its device span (CUPTI); host time inside the call beyond the span
# by more than this (a Python wrapper and a launch) counts in full: work done on the host is
# part of the call's cost.
EAGER_LAUNCH_ALLOWANCE_MS = 0.05


def cpu_flush_bytes() -> int:
    return min(2 * last_level_cache_bytes(), CPU_FLUSH_CAP)


@dataclass
class Plan:
    """How one workload is timed, decided after the warm-up (``Timer.arm``). The parent
    passes its public fields to the trusted worker, which runs the same loop without the
    call to measure the loop's own cost for the outside clock."""

    method: str  # "cuda-graph" | "cuda-events" | "host-clock"
    iters: int
    n_sets: int
    pad_ms: float = 0.0  # device idle time queued before each timed call (GPU)
    warmup_iters: int = 0
    eager_warmup_median_ms: float = 0.0
    loop_warmup_median_ms: float = 0.0  # fresh inputs and flush before a call, in the warm-up
    graph_error: str | None = None
    # (graph, static outputs) per set. The graphs share one memory pool (``_capture``): a set's
    # outputs are valid only until another set's graph replays, whose temporaries may lie in
    # them. Read a set's outputs right after its own replay, on the replay's stream; never
    # replay the graphs concurrently or keep a set's outputs across another's replay.
    graphs: list = field(default_factory=list, repr=False)

    def public(self) -> dict:
        return {"method": self.method, "iters": self.iters, "n_sets": self.n_sets, "pad_ms": self.pad_ms}


# one input refill: (set index, seed index) -> None; negative seed indices are warm-up data
Refill = Callable[[int, int], None]
Scramble = Callable[[object, int], None]
# one call's digest: (set index, iteration, outputs) -> a digest to keep, or None when kept elsewhere
Digest = Callable[[int, int, object], object | None]


class PendingStats:
    """A timed loop's statistics, read when the guard asks (``read``). The profiler that
    recorded the loop is stopped then, not at the loop's end: its stop (CUPTI's records flushed
    and taken in, 54 ms a workload in session 37's profile) runs after the reply that ends the
    guard's clock, while the trusted worker checks the loop's sample, instead of inside the
    ``run`` request the benchmark waits for. ``drop`` stops it without reading (a request other
    than ``stats`` came first). What the profiler records after the loop (the digests' copy
    out, a thread's launches) is not the loop's: a graph loop's spans need exactly its launches
    (``graph_launch_spans``: more, and the events time it, as for any failed CUPTI read), an
    eager loop's lie between its markers (``marked_call_spans``)."""

    def __init__(self, prof: Any, cupti_error: str | None, statistics: Callable[[Any, str | None], dict]) -> None:
        self._prof, self._error, self._statistics = prof, cupti_error, statistics
        self._recording = prof is not None

    def drop(self) -> None:
        """Stop the profiler, once, whoever asks first: the read, a request other than ``stats``,
        the loop's own failure."""
        if self._recording:
            self._recording = False
            self._prof, self._error = _stop_profiler(self._prof, self._error)

    def read(self) -> dict:
        self.drop()
        return self._statistics(self._prof, self._error)


def _stop_profiler(prof: Any, cupti_error: str | None) -> tuple[Any, str | None]:
    """(the profiler, or None where its stop failed; the error to report)."""
    try:
        prof.stop()
        return prof, cupti_error
    except Exception as exc:  # noqa: BLE001 - the profiler's failure, not the candidate's
        return None, f"profiler stop: {type(exc).__name__}: {exc}"[:200]


class Timer:
    """One per worker: holds the flush buffer, the device-idle calibration and the graphs."""

    def __init__(self, device: str, flush_bytes: int | None = None):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if flush_bytes is None:
            if self.is_cuda:
                flush_bytes = 2 * int(torch.cuda.get_device_properties(self.device).L2_cache_size)
            else:
                flush_bytes = cpu_flush_bytes()
        self.flush_bytes = int(flush_bytes)
        self.flush_buf = T.empty(max(1, self.flush_bytes // 4), dtype=torch.int32, device=self.device)
        self._reset_l2 = _persisting_l2_reset() if self.is_cuda else None
        self._flush_ms = self._measure_flush() if self.is_cuda else 0.0
        if self.is_cuda:
            self._start_cupti()

    def _start_cupti(self) -> None:
        """CUPTI's first session in a process takes about a second: pay it here, not in a verdict."""
        try:
            with T.profile(activities=[T.cuda_activity]):
                T.zero_(self.flush_buf[:1024])
                T.cuda_sync()
        except Exception:  # noqa: BLE001 - run() falls back to events and says why
            pass

    # -- device-side helpers ----------------------------------------------------------------
    def _flush(self) -> None:
        T.zero_(self.flush_buf)
        if self._reset_l2 is not None:
            self._reset_l2()

    def _measure_flush(self) -> float:
        """Device time of one flush in ms (events around ten, after a warm-up)."""
        for _ in range(3):
            self._flush()
        start, end = T.cuda_event(enable_timing=True), T.cuda_event(enable_timing=True)
        T.cuda_sync()
        T.event_record(start)
        for _ in range(10):
            self._flush()
        T.event_record(end)
        T.cuda_sync()
        return max(T.event_elapsed(start, end) / 10, 1e-3)

    def idle(self, ms: float) -> None:
        """Keep the device busy for about ``ms`` with more flush passes: memory-bound work whose
        time, unlike a spin on the SM clock, hardly moves with the clock the GPU runs at, so
        the loop's own cost is the same in the guard's two windows."""
        if ms > 0 and self.is_cuda:
            self.idle_passes(max(1, math.ceil(ms / self._flush_ms)))

    def idle_passes(self, passes: int) -> None:
        """``passes`` flush passes: device idle time counted in work, not in this worker's
        estimate of a pass's time, so two workers queue exactly the same padding."""
        if self.is_cuda:
            for _ in range(passes):
                T.zero_(self.flush_buf)

    @property
    def flush_ms(self) -> float:
        return self._flush_ms

    def pass_ms(self, passes: int) -> float:
        """Device time of one flush pass now (events around ``passes`` of them), measured as
        the calibration is: after as many untimed passes, so that a device waking from idle
        (its first kernels run slower: 48 us a pass against 32 us was seen on the H200, for
        every probe of ten seconds) does not read as another process's work."""
        start, end = T.cuda_event(enable_timing=True), T.cuda_event(enable_timing=True)
        T.cuda_sync()
        self.idle_passes(passes)
        T.event_record(start)
        self.idle_passes(passes)
        T.event_record(end)
        T.cuda_sync()
        return float(T.event_elapsed(start, end)) / max(1, passes)

    # -- warm-up, capture, plan -------------------------------------------------------------
    def arm(
        self,
        call: Callable[[int], object],
        n_sets: int,
        refill: Refill,
        min_iters: int,
        max_iters: int,
        target_time_s: float,
        warmup_time_s: float,
        use_graphs: bool = True,
        graph_holds: Callable[[int, object, Callable[[], None]], str | None] | None = None,
    ) -> Plan:
        """Warm up (every input set at least once: compilation, autotuning, caches), decide
        the iteration count, capture one graph per input set where the call can be captured
        and the graph does the call's work (``graph_holds(set, static outputs, replay)`` gives
        the reason when it does not)."""
        warm_ms, host_call_ms, loop_ms, i = [], [], [], 0
        budget_end = T.perf_counter() + warmup_time_s
        while i < n_sets or T.perf_counter() < budget_end:
            k = i % n_sets
            r0 = T.perf_counter()
            refill(k, -1 - i)
            self._flush()
            self._sync()
            h0 = T.perf_counter()
            loop_ms.append((h0 - r0) * 1e3)
            call(k)
            h1 = T.perf_counter()
            self._sync()
            h2 = T.perf_counter()
            warm_ms.append((h2 - h0) * 1e3)
            host_call_ms.append((h1 - h0) * 1e3)
            i += 1
            if i >= max(n_sets, 1000):
                break
        est = max(statistics.median(warm_ms[-max(1, len(warm_ms) // 2) :]), 1e-4)
        # The loop's own work (fresh inputs, flush) runs before every call, and the outside
        # clock runs the same count four times more: the count is set by what an iteration
        # costs in all, so a short call on large custom-made inputs does not take 500 of them.
        loop_est = statistics.median(loop_ms[-max(1, len(loop_ms) // 2) :])
        iters = int(min(max_iters, max(min_iters, math.ceil(target_time_s * 1e3 / (est + loop_est)))))
        plan = Plan(
            method="host-clock",
            iters=iters,
            n_sets=n_sets,
            warmup_iters=len(warm_ms),
            eager_warmup_median_ms=est,
            loop_warmup_median_ms=loop_est,
        )
        if not self.is_cuda:
            return plan
        plan.method = "cuda-events+host-sync"
        # eager: the device idles while the host enqueues the call, so the event window holds
        # the call's device work rather than its launch latency
        plan.pad_ms = min(2.0, max(0.1, 3.0 * statistics.median(host_call_ms)))
        if use_graphs:
            graphs, why = self._capture(call, n_sets)
            if graphs is not None and graph_holds is not None:
                for k, (g, out) in enumerate(graphs):
                    why = graph_holds(k, out, lambda g=g: T.graph_replay(g))
                    if why:
                        graphs = None
                        break
            if graphs is not None:  # a graph replay has no launch latency to hide: no padding
                plan.method, plan.graphs, plan.pad_ms = "cuda-graph", graphs, 0.0
            else:
                plan.graph_error = why
        return plan

    def _sync(self) -> None:
        if self.is_cuda:
            T.cuda_sync()

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
            # Blocks cached for the warm-up's outputs (on two streams) cannot serve the graphs'
            # private pool: give them back first, or a large call's outputs are held three times.
            torch.cuda.empty_cache()
            # One pool for the sets' graphs: each graph's temporaries, freed at the end of its
            # capture, serve the next one's, where private pools held them once per set (a
            # ResNet's activations four times). Safe because the graphs only ever run one after
            # another on one stream, and a graph's outputs, which stay allocated, are read
            # (digested, compared) right after its own replay, before any other graph runs.
            pool = torch.cuda.graph_pool_handle()
            graphs = []
            for k in range(n_sets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
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

    # -- the timed loop ---------------------------------------------------------------------
    def run(
        self,
        plan: Plan,
        call: Callable[[int], object] | None,
        refill: Refill,
        scramble: Scramble,
        digest: Digest | None,
        outputs_of: Callable[[int], object] | None = None,
        max_time_s: float | None = None,
        use_cupti: bool = True,
    ) -> tuple[PendingStats, list]:
        """Time ``plan.iters`` calls, each on fresh inputs (``refill``), its reachable outputs
        overwritten with random values first (``scramble``; a graph's static outputs, or
        ``outputs_of(set)`` for destination-passing buffers) and its result digested after
        (``digest(set, iteration, outputs)``, which may keep it itself and give None), all outside the
        timed span. ``call`` None runs the loop without the call: the loop's own cost, for the
        outside clock. Returns (pending, digests): ``pending.read()`` stops the profiler and gives
        the statistics (``PendingStats``); a loop that raises stops it at once."""
        if plan.method == "cuda-graph":
            return self._graph_loop(plan, call is not None, refill, scramble, digest, use_cupti)
        return self._eager_loop(plan, call, refill, scramble, digest, outputs_of, max_time_s, use_cupti)

    def _graph_loop(self, plan: Plan, with_call: bool, refill, scramble, digest, use_cupti: bool):
        # the loop without the call runs under CUPTI too: its per-launch cost is the same then
        prof, cupti_error = self._start_profiler() if use_cupti else (None, None)
        iters = plan.iters
        starts = [T.cuda_event(enable_timing=True) for _ in range(iters)]
        ends = [T.cuda_event(enable_timing=True) for _ in range(iters)]
        digests = []
        pending = PendingStats(
            prof, cupti_error, lambda prof, error: self._graph_stats(plan, with_call, prof, error, starts, ends)
        )
        T.cuda_sync()
        try:
            for it in range(iters):
                g, out = plan.graphs[it % plan.n_sets]
                refill(it % plan.n_sets, it)
                scramble(out, it)
                self._flush()
                self.idle(plan.pad_ms)
                T.event_record(starts[it])
                if with_call:
                    T.graph_replay(g)
                T.event_record(ends[it])
                if digest is not None:
                    kept = digest(it % plan.n_sets, it, out)
                    if kept is not None:
                        digests.append(kept)
            T.cuda_sync()
        except BaseException:
            pending.drop()
            raise
        # Stopping the profiler and reading its records are left to ``read``, after the reply
        # that ends the guard's clock.
        return pending, digests

    def _graph_stats(self, plan: Plan, with_call: bool, prof, cupti_error, starts, ends) -> dict:
        iters = plan.iters
        events = [T.event_elapsed(s, e) for s, e in zip(starts, ends)]
        spans, kernels = None, []
        if prof is not None and with_call:
            try:
                spans, cupti_error, kernels = graph_launch_spans(prof.profiler.kineto_results.events(), iters)
            except Exception as exc:  # noqa: BLE001
                spans, cupti_error = None, f"reading CUPTI records: {type(exc).__name__}: {exc}"[:200]
            # a replay's device work lies inside its event window; if not, the records are not ours
            if spans is not None and T.median(spans) > 1.05 * T.median(events) + 1e-3:
                spans, cupti_error = (
                    None,
                    (f"CUPTI median {T.median(spans):.4f} ms exceeds the event median {T.median(events):.4f} ms"),
                )
        stats = summarize(spans if spans is not None else events)
        stats.update(
            event_median_ms=T.median(events),
            event_mean_ms=statistics.fmean(events),
            method="cuda-graph+cupti" if spans is not None else "cuda-graph",
            off_stream_suspect=False,
            **self._plan_fields(plan),
        )
        if spans is None and with_call:
            stats["cupti_error"] = cupti_error or "off"
        elif spans is not None:  # kernels, copies and memsets per call: fusion shows here
            stats["device_ops_per_call"] = statistics.median(kernels)
        return stats

    def _eager_loop(self, plan: Plan, call, refill, scramble, digest, outputs_of, max_time_s, use_cupti: bool = True):
        overhead_ms = self._calibrate_sync(plan.pad_ms) if self.is_cuda else 0.0
        prof, cupti_error = self._start_profiler() if self.is_cuda and use_cupti and call is not None else (None, None)
        lat_ms, ev_ms, host_ms, call_host_ms, digests = [], [], [], [], []
        figures = (lat_ms, ev_ms, host_ms, call_host_ms)  # filled by the loop, read by ``read``
        pending = PendingStats(
            prof, cupti_error, lambda prof, error: self._eager_stats(plan, call, overhead_ms, figures, prof, error)
        )
        t_begin = T.perf_counter()
        try:
            for it in range(plan.iters):
                # A very slow kernel (or Triton's CPU interpreter) stops early, with at least 5
                # iterations; the count is reported with the result (and the outside clock's
                # loop runs the same count).
                if max_time_s is not None and it >= 5 and T.perf_counter() - t_begin > max_time_s:
                    break
                k = it % plan.n_sets
                refill(k, it)
                if outputs_of is not None:
                    scramble(outputs_of(k), it)
                self._flush()
                lat, ev, host, in_call, out = self._iteration(
                    call, k, plan.pad_ms, overhead_ms, marked=prof is not None
                )
                lat_ms.append(lat)
                ev_ms.append(ev)
                host_ms.append(host)
                call_host_ms.append(in_call)
                if digest is not None:  # without a call (the loop's own cost): the buffers given
                    kept = digest(k, it, out if call is not None else outputs_of(k))
                    if kept is not None:
                        digests.append(kept)
                del out
        except BaseException:
            pending.drop()
            raise

        return pending, digests

    def _eager_stats(
        self,
        plan: Plan,
        call: object,
        overhead_ms: float,
        loop: tuple[list[float], list[float], list[float], list[float]],
        prof: Any,
        cupti_error: str | None,
    ) -> dict:
        """An eager loop's statistics from its per-call figures (``loop``: latencies, event
        times, host times, host times inside the call) and its profiler's records."""
        lat_ms, ev_ms, host_ms, call_host_ms = loop
        spans = None
        if prof is not None:
            spans, why = self._eager_spans(prof, len(lat_ms), ev_ms)
            if spans is None:
                cupti_error = why
        if spans is not None:
            # the call's device work; host time in the call beyond a launch's counts in full
            timed = [
                s if h <= s + EAGER_LAUNCH_ALLOWANCE_MS else max(s, lat)
                for s, h, lat in zip(spans, call_host_ms, lat_ms)
            ]
        else:
            timed = lat_ms
        stats = summarize(timed)
        stats.update(
            event_median_ms=statistics.median(ev_ms),
            event_mean_ms=statistics.fmean(ev_ms),
            host_median_ms=statistics.median(host_ms),
            sync_overhead_ms=overhead_ms,
            call_host_median_ms=statistics.median(call_host_ms),
            method=(plan.method.replace("host-sync", "cupti") if spans is not None else plan.method),
            **self._plan_fields(plan),
        )
        stats["iters_run"] = len(lat_ms)
        if plan.graph_error:
            stats["graph_error"] = plan.graph_error
        if self.is_cuda and spans is None and call is not None:
            stats["cupti_error"] = cupti_error or "off"
        # Work that escapes the event window (another stream, host work after the last
        # launch) shows as host time well above event time; say so in the result.
        stats["off_stream_suspect"] = bool(
            self.is_cuda and stats["host_median_ms"] - overhead_ms > 1.2 * stats["event_median_ms"] + 0.01
        )
        return stats

    def _start_profiler(self):
        try:
            prof = T.profile(activities=[T.cuda_activity])
            prof.start()
            return prof, None
        except Exception as exc:  # noqa: BLE001 - no CUPTI: the events still time the loop
            return None, f"profiler: {exc}"[:200]

    def _eager_spans(self, prof, iters: int, events_ms: list[float]):
        try:
            spans, why = marked_call_spans(prof.profiler.kineto_results.events(), iters)
        except Exception as exc:  # noqa: BLE001
            return None, f"reading CUPTI records: {type(exc).__name__}: {exc}"[:200]
        if spans is not None and T.median(spans) > 1.05 * T.median(events_ms) + 1e-3:
            return None, (
                f"CUPTI median {T.median(spans):.4f} ms exceeds the event median {T.median(events_ms):.4f} ms"
            )
        return spans, why

    def _iteration(self, call, k: int, pad_ms: float, overhead_ms: float, marked: bool = False):
        """One eager iteration: (latency, event time, host time, host time inside the call,
        outputs). ``marked``: a marker kernel before the start event and after the end event
        brackets the call's device work in the CUPTI records (``marked_call_spans``)."""
        if self.is_cuda:
            start, end = T.cuda_event(enable_timing=True), T.cuda_event(enable_timing=True)
            T.cuda_sync()
            h0 = T.perf_counter()
            self.idle(pad_ms)
            if marked:
                T.marker(1)
            T.event_record(start)
            c0 = T.perf_counter()
            out = call(k) if call is not None else None
            c1 = T.perf_counter()
            T.event_record(end)
            if marked:
                T.marker(1)
            T.cuda_sync()
            h1 = T.perf_counter()
            event_ms = T.event_elapsed(start, end)
            host_ms = (h1 - h0) * 1e3
            return max(event_ms, host_ms - overhead_ms), event_ms, host_ms, (c1 - c0) * 1e3, out
        # the lesser of its wall and its process's CPU time: a stall (the machine's other work
        # holding the core) lengthens the one, not the other, and the baselines, cached for
        # later runs, are timed the same way; a call on two threads uses more CPU than wall
        c0 = T.process_time()
        h0 = T.perf_counter()
        out = call(k) if call is not None else None
        h1 = T.perf_counter()
        ms = min(h1 - h0, T.process_time() - c0) * 1e3
        return ms, ms, ms, ms, out

    def _calibrate_sync(self, pad_ms: float) -> float:
        """Host time of an eager iteration without a call, beyond its event window: the
        device idle time and the synchronisations."""
        gaps = []
        for _ in range(30):
            _, ev, host, _, _ = self._iteration(None, 0, pad_ms, 0.0)
            gaps.append(host - ev)
        return statistics.median(gaps[5:])

    def _plan_fields(self, plan: Plan) -> dict:
        return {
            "n_sets": plan.n_sets,
            "flush_bytes": self.flush_bytes,
            "flush_ms": self._flush_ms,
            "warmup_iters": plan.warmup_iters,
            "planned_iters": plan.iters,
            "eager_warmup_median_ms": plan.eager_warmup_median_ms,
            "loop_warmup_median_ms": plan.loop_warmup_median_ms,
            "pad_ms": plan.pad_ms,
        }


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
