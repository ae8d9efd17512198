"""The outside clock's windows for one workload (``guard.outside_clock`` judges them): the
candidate's loop of calls timed by the guard's clock, then the same loop without the call in the
trusted worker while the candidate's processes are stopped; its bands, its padding on a GPU, and
where its figure floors the candidate's own. A GPU's windows are here; a CPU's, whose inputs the
guard writes and whose outputs it reads, are in ``cpu_windows``."""

from __future__ import annotations

import logging
import math
import time
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import outside_clock
from ..runner import messages as m
from .cpu_windows import CpuWindows
from .reasons import GuardError, Rejection
from .reference_side import ReferenceSide
from .workload_requests import WorkloadContext, call, candidate_stopped, failure, no_gc, wait_device_idle

log = logging.getLogger(__name__)


def figure_floors(ref: ReferenceSide, host_bound: bool) -> bool:
    """Whether the outside figure is a floor under the decided one (``floor_by_outside_clock``):
    on the CPU, whose band cannot hold the candidate's own median to it, and on a GPU whose loop
    the host paces (``pad_passes``), where the outside figure holds host time that the
    candidate's device span does not."""
    return ref.device.kind != "cuda" or host_bound


def floor_by_outside_clock(stats: dict[str, Any], clock: outside_clock.OutsideClock) -> None:
    """On a CPU the candidate's own median (its process's clock) cannot be held to the outside
    clock's band, which must be wide there (100% + 5 ms: a loaded machine stalls windows), while
    calls take a fraction of a millisecond: a red team halved its medians and was ACCEPTed. The
    figure that decides is therefore never below what the guard's own clock saw per call
    (``OutsideClock.floor_ms``: on a CPU also a share of a paced window's figure, which batching
    a window's calls cannot shorten); the candidate's own median is kept beside it
    (``inside_median_ms``). Tampering can then only make a CPU figure slower. A GPU keeps
    CUPTI's figure, held to a 10% band, except where its loop is host-bound: there an honest
    eager call's host time is in the outside figure and not in its span (a Triton call of two
    launches: 106 us outside, 9 us inside, on the H200), and the guard's figure, which is never
    below the call's device time, decides."""
    inside = float(stats["median_ms"])
    floor = clock.floor_ms
    if floor > inside:
        stats["inside_median_ms"] = inside
        stats["median_ms"] = floor
        stats["floored_by_outside_clock"] = True


def bands(ref: ReferenceSide, loop: str) -> tuple[float, float, float]:
    c = ref.cfg
    if ref.device.kind != "cuda":
        return c.outside_rel_band_cpu, c.outside_abs_band_ms_cpu, c.outside_loop_slack_cpu
    if loop == "captured":
        return c.outside_rel_band, c.outside_abs_band_ms, c.outside_loop_slack
    return c.outside_rel_band, c.outside_abs_band_ms_host, c.outside_loop_slack_host


def pad_passes(ref: ReferenceSide, host_ms: float, flush_ms: float) -> tuple[int, float, bool]:
    """Flush passes before each iteration of the outside clock's loop, about how long they
    take, and whether the cap cut them short: enough for the host to enqueue one iteration
    meanwhile, so the device never waits for it. Both workers queue the same count. The
    figures come from the candidate's process, hence the cap (padding widens the band): too
    little padding only makes its own loop slower. Cut short, the loop is host-bound by the
    candidate's own account, and its outside figure floors the decided one
    (``figure_floors``): a candidate that overstates its host time to get there is
    held to the guard's clock itself, a tighter bound than the band."""
    if ref.device.kind != "cuda":
        return 0, 0.0, False
    # a floor below any GPU's pass over twice its L2, so a tiny reported figure cannot inflate
    # the count; a figure that is not a number is refused at once
    if not (math.isfinite(flush_ms) and math.isfinite(host_ms)):
        raise ValueError(f"the candidate's worker reported flush {flush_ms!r} ms, host {host_ms!r} ms")
    flush_ms = max(flush_ms, 0.02)
    cap = math.ceil(ref.cfg.confirm_pad_max_ms / flush_ms)
    # compared as floats: a finite figure near the largest double overflows ceil's integer
    wanted = 1.25 * max(0.0, host_ms) / flush_ms
    passes = min(cap, math.ceil(wanted)) if wanted <= cap else cap
    return passes, passes * flush_ms, wanted > cap


def least_loop_calls(ref: ReferenceSide) -> int:
    """The calls the candidate's outside-clock loop is made for at least, at warm-up, before
    anyone knows whether its loop is host-bound (``Arm.confirm_least``): as many as a
    host-bound window may run where ``outside_window_s_host`` is set on a GPU, else 0."""
    if ref.device.kind != "cuda" or not ref.cfg.outside_window_s_host:
        return 0
    return ref.cfg.outside_calls_most_host


def window_calls(ref: ReferenceSide, calls: int, host_ms: float, host_bound: bool) -> int:
    """The calls of each outside-clock window on a GPU: the timed loop's ``calls``, or, where the
    loop is host-bound (``pad_passes``), enough for a window of ``outside_window_s_host`` by the
    candidate's host time per iteration, at most ``outside_calls_most_host`` (or ``calls``).
    There the outside figure floors the decided one and is the difference of two host-paced
    walls, whose jitter over a short window is as large as a small call (H100, session 51: a 10
    us Triton call floored at 19 us in one verdict and not in the next, and every later
    verdict paired against it). The figure comes from the candidate's process: overstated, it
    can only shorten the windows back to the timed loop's calls (a figure of 1 ms or more does),
    which longer windows do not favour either; understated, the loop is not host-bound."""
    if not host_bound or not (least := least_loop_calls(ref)):
        return calls
    most = max(calls, least)
    wanted = ref.cfg.outside_window_s_host * 1e3 / max(host_ms, 1e-3)  # a float: no overflow
    return calls if wanted <= calls else most if wanted >= most else math.ceil(wanted)


@dataclass
class Checked:
    """One window's calls to check: their seed, which, and their digests (a GPU) or outputs as
    the guard read them (a CPU)."""

    seed: int
    chosen: list[int]
    digests: list[Any]
    read: list[list[m.ReadOutput | None]] | None


def run_windows(
    cx: WorkloadContext,
    run_seed: int,
    n: int,
    passes: int,
    copies: bool,
    projection_seed: int,
    judge: Callable[[list[float], list[float]], outside_clock.OutsideClock],
    floors: bool,
    check_rng: random.Random,
    first_window: int = 0,
    paced: bool = False,
    most: int | None = None,
    loops: int = 1,
) -> tuple[list[float], list[float], list[Checked], outside_clock.OutsideClock]:
    """The outside clock: the candidate's loop of calls, then the same loop without the call in
    the trusted worker while the candidate's processes are stopped; each window on new data,
    as many as ``outside_clock.run_windows`` decides (more only while ``judge`` finds the figure
    contradicted). (walls of the candidate's loops, walls of the trusted loops, the calls to
    check per window, the judgement on all the windows run).

    On a CPU (``CpuWindows``) the candidate's worker gets each call's inputs from the guard
    (``runner/staged.py``), all before the window or, ``paced``, each once the call before it is
    done (``runner/pacing.py``), and says where each call's outputs lie as it is done; the guard
    reads the chosen calls' outputs then (``held_outputs``). The candidate's window ends when
    its whole tree is stopped, not when it replies (a thread that went on computing after the
    reply would otherwise do its work off the clock), and the trusted window, run alike, ends
    the same way. Each window is charged the CPU time its two sides took where the sandbox
    counts it, else its wall time plus the CPU time its tree used beside its busiest thread
    (``CpuWindows.charge``): calls run on a second core are paid for either way.

    ``first_window``: windows already run for this workload (a CPU's first windows, too short,
    are run again longer): the new ones take the next seeds, so no call sees inputs an earlier
    window's call saw and could answer from memory. ``paced`` (a CPU): each call's inputs are
    written once the call before it is done (``runner/pacing.py``), else all before the window.
    ``most``: at most this many windows (else the configuration's). ``loops``: the trusted
    loops run after each window of the candidate's, on its inputs (the shortest of all is
    subtracted: a loop that the machine's other work slowed shortens the figure)."""
    ref, w = cx.ref, cx.w
    held = ref.device.kind != "cuda"
    run_walls: list[float] = []  # charged: wall time, and CPU time on other cores (a CPU)
    run_parallel: list[float] = []
    loop_walls: list[float] = []
    confirms: list[Checked] = []
    if most is None:
        most = ref.cfg.outside_windows if ref.device.kind == "cuda" else ref.cfg.outside_windows_cpu

    cpu = CpuWindows(cx, n, copies, projection_seed, paced) if held else None

    def window() -> outside_clock.OutsideClock:
        index = first_window + len(run_walls)  # windows of a workload never share data or files
        seed = ref.seed(f"confirm-{index}", run_seed)
        chosen = sorted(check_rng.sample(range(n), min(ref.cfg.replay_checks, n)))
        parallel = 0.0
        if cpu is not None:
            ran = cpu.run(index, seed, chosen)
            digests: list[Any] = []
            read = ran.read
        else:
            run_wall, digests = gpu_window(seed, chosen)
            read = None
        with candidate_stopped(cx.worker, w, "while the guard timed its loop without the call"):
            if cpu is not None:
                run_wall, parallel = cpu.charge(ran)
                cpu.reject_reuse(ran)
            loop_walls.extend(trusted_loop(seed, chosen) for _ in range(loops))
        run_walls.append(run_wall)
        run_parallel.append(parallel)
        confirms.append(Checked(seed, chosen, digests, read))
        return judged()

    def gpu_window(seed: int, chosen: list[int]) -> tuple[float, list[Any]]:
        """A GPU's window: the candidate's loop draws its own inputs (in graphs) and digests
        every call. (its wall, the chosen calls' digests)."""
        with no_gc():
            t0 = time.monotonic()
            confirm = m.Confirm(seed=seed, iters=n, pad_passes=passes, copies=copies)
            confirmed = call(cx.worker, confirm, m.ConfirmReply, cx.timeout)
            run_wall = time.monotonic() - t0
        if not confirmed.ok:
            raise failure(confirmed, w, "timing")
        if len(confirmed.digests) != n:
            raise Rejection(
                "benchmark",
                "REWARD_HACK",
                f"the outside clock's loop on {w.uuid} reported {len(confirmed.digests)} calls for {n}",
                None,
                w.uuid,
            )
        return run_wall, [confirmed.digests[i] for i in chosen]

    def trusted_loop(seed: int, chosen: list[int]) -> float:
        """The loop without the call, on ``seed``'s data, in the trusted worker (the candidate's
        processes stopped by the caller): its wall time less its set-up; on a CPU charged as the
        candidate's window is (``CpuWindows.trusted_charge``)."""
        wait_device_idle(ref, cx.trusted, w, "before the guard's loop")
        overhead = m.Overhead(
            **cx.trusted_fields(),
            seed=seed,
            iters=n,
            pad_passes=passes,
            copies=copies,
            projection_seed=projection_seed,
            paced=paced and held,
        )
        if cpu is not None:
            loop_wall, ran_s, loop = cpu.trusted(overhead, chosen)
        else:
            with no_gc():
                t0 = time.monotonic()
                loop = call(cx.trusted, overhead, m.OverheadReply, cx.timeout)
                loop_wall, ran_s = time.monotonic() - t0, math.inf
        wait_device_idle(ref, cx.trusted, w, "after the guard's loop")
        if not loop.ok:
            raise GuardError(f"the trusted worker could not run the timing loop: {loop.message}")
        charged_s, ran_s = loop_wall - loop.setup_s, ran_s - loop.setup_cpu_s
        log.debug("trusted loop on %s: %.5f s charged, %.5f s run", w.uuid, charged_s, ran_s)
        return cpu.trusted_charge(charged_s, ran_s) if cpu is not None else charged_s

    def loop_again() -> outside_clock.OutsideClock:
        with candidate_stopped(cx.worker, w, "while the guard timed its loop again without the call"):
            loop_walls.append(trusted_loop(confirms[-1].seed, confirms[-1].chosen))
        return judged()

    def judged() -> outside_clock.OutsideClock:
        shortest = min(range(len(run_walls)), key=run_walls.__getitem__)
        return judge(run_walls, loop_walls).model_copy(
            update={"parallel_s": run_parallel[shortest], "loop_windows": len(loop_walls)}
        )

    clock = outside_clock.run_windows(
        window,
        ref.cfg.outside_windows_first,
        most,
        floors,
        ref.pool.quiet_spare,
        loop_again if floors else None,
        retry_floor=floors and not held,  # a GPU's host-bound loop (a CPU's floors every figure)
    )
    return run_walls, loop_walls, confirms, clock


def reject_disagreement(
    cx: WorkloadContext, clock: outside_clock.OutsideClock, run_walls: list[float], loop_walls: list[float], n: int
) -> None:
    """REWARD_HACK when the outside clock contradicts the candidate's figure either way."""
    w = cx.w
    walls = (
        f"calls with the loop {min(run_walls):.4f} s, the loop alone {min(loop_walls):.4f} s, {n} calls "
        f"(shortest of {len(run_walls)} windows each)"
    )
    if clock.quiet_wait_s is not None:
        walls += f"; the later windows after {clock.quiet_wait_s:.1f} s waiting for a starting worker"
    if clock.short_loop:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's loop of calls on {w.uuid} ran {-clock.outside_ms * 1e3:.1f} us a call faster "
            "than the same loop without the call, as the guard's own clock measured it: the candidate's "
            "process skipped part of the loop's own work (padding, draws or digests)",
            f"allowed: {clock.abs_band_ms * 1e3:.1f} us; {walls}",
            w.uuid,
        )
    if not clock.agrees:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the guard's own clock measured {clock.outside_ms * 1e3:.1f} us per call on {w.uuid}, "
            f"but the candidate's process reported {clock.inside_ms * 1e3:.1f} us: the timing "
            "inside the candidate's process was tampered with",
            f"allowed: {clock.rel_band:.0%} + {clock.abs_band_ms * 1e3:.1f} us; {walls}",
            w.uuid,
        )
