"""Timing one workload so that the figure can be trusted, in these requests:

1. ``arm`` (candidate worker): live input sets, warm-up, graph capture, the loop's plan;
2. ``run`` (candidate worker): the timed loop on the data of a seed it learns only now, every
   call on fresh inputs with its outputs scrambled first and digested after; then ``stats``,
   while the trusted worker checks a secret sample of the loop's digests (as in 5);
3. ``confirm`` (candidate worker): the outside clock's loop (``runner/confirm.py``): padding,
   fresh inputs, the call, digests, nothing else; the guard's own clock runs around it;
4. ``overhead`` (trusted worker, the candidate's processes stopped meanwhile): the same loop
   without the call, timed by the same clock; what is left is what the calls cost
   (``guard.outside_clock``). Nothing in this request comes from the candidate;
5. ``verify_replays`` (trusted worker): a secret sample of the digests of the outside clock's
   loop against the reference on those calls' own inputs.

A failure of 2-5 that only a candidate that behaves differently while timed, or that forges
its timing, can cause is REWARD_HACK.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from .. import outside_clock
from . import held_outputs, memory_plan
from ..problems import tolerance as tolerance_mod
from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner import nvml
from ..runner.refill_kinds import stream_refill_possible
from ..runner.freeze import FreezeError, frozen
from ..runner import tree_cpu
from ..runner.process import WorkerProcess
from .asking import Asked, ask
from .reasons import GuardError, Rejection, Unpaired, candidate_status, first_line
from ..verdict import Timing
from .reference_side import ReferenceSide

log = logging.getLogger(__name__)


def _call(
    worker: WorkerProcess, request: m.CandidateRequest | m.TrustedRequest, reply_model: type[m.R], timeout: float
) -> m.R:
    return ask(worker, request, reply_model, timeout, "benchmark")


def _check_counts(plan: m.Plan, n: int, run_s: float, timing: m.TimingConfig, max_timing_s: float, w: Workload) -> None:
    """The counts come from the candidate's process: the plan must lie within the guard's
    bounds, and a loop may stop short of it only when the guard's own clock saw it run for
    the time limit. The outside clock's loop runs the same count, and a short one would put
    a window's fixed costs into every call's share of the band."""
    planned = plan.iters
    if not min(timing.min_iters, timing.max_iters) <= planned <= timing.max_iters:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker planned {planned} timed calls on "
            f"{w.uuid}, outside the guard's {timing.min_iters}-{timing.max_iters}",
            None,
            w.uuid,
        )
    early = n < planned and n >= 5 and plan.method != "cuda-graph" and run_s >= 0.9 * max_timing_s
    if n != planned and not early:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the timed loop on {w.uuid} reported {n} calls for "
            f"{planned} planned (in {run_s:.2f} s by the guard's clock)",
            None,
            w.uuid,
        )


def wait_device_idle(ref: ReferenceSide, trusted: WorkerProcess, w: Workload, when: str) -> None:
    """With the candidate's processes stopped, nothing else should run on the device while the
    trusted worker times its loop; work the candidate queued before it was stopped still does,
    and would lengthen that loop and so shorten the outside figure. Wait for the device to be
    idle (flush passes as fast as the trusted worker's calibration), up to ``drain_wait_s``."""
    if ref.device.kind != "cuda":
        return
    deadline = time.monotonic() + ref.cfg.drain_wait_s
    while True:
        probe = _call(trusted, m.DeviceIdle(), m.DeviceIdleReply, ref.cfg.call_timeout_s)
        if not probe.ok:
            raise GuardError(f"the trusted worker could not probe the device: {probe.message}")
        if probe.pass_ms <= ref.cfg.drain_factor * probe.flush_ms:
            return
        if time.monotonic() > deadline:
            raise Rejection(
                "benchmark",
                "REWARD_HACK",
                f"the device stayed busy {when} on {w.uuid} while the candidate's processes were "
                f"stopped: work it left queued slows what the guard measures next",
                f"a flush pass took {probe.pass_ms * 1e3:.1f} us against {probe.flush_ms * 1e3:.1f} us "
                f"idle, for {ref.cfg.drain_wait_s:.0f} s",
                w.uuid,
            )
        time.sleep(0.05)


class StoppedButRan(Rejection):
    """A candidate's process tree ran while the guard had it stopped (or could not be stopped):
    whatever was measured meanwhile may have been slowed on purpose."""


@contextlib.contextmanager
def candidate_stopped(worker: WorkerProcess, w: Workload, during: str, accuse: bool = True) -> Iterator[None]:
    """The candidate's whole process tree stopped for the block (``runner.freeze``); a tree
    that keeps growing when stopped, or that used CPU time or made processes meanwhile, is
    REWARD_HACK (StoppedButRan): a process that escaped the stop can slow what the guard
    measures while the candidate is supposed to be still, and so shorten its outside figure.
    ``accuse`` False (an incumbent stopped while a challenger is timed): Unpaired instead."""
    pid = worker.proc.pid if worker.proc is not None else None
    failed: BaseException | None = None  # what the block raised: second to an escape, which may have caused it
    try:
        with frozen(pid) as fz:
            try:
                yield
            except BaseException as exc:  # noqa: BLE001 - raised again below
                failed = exc
    except FreezeError as exc:
        # Whether it keeps growing or will not stop (a process held in uninterruptible sleep
        # by its own child: a red team's incumbent blocked every challenger so), the stopped
        # candidate's doing: an idle worker's processes stop at once.
        why: str | None = str(exc)
    else:
        why = fz.escaped()
    if why is not None:
        reason = f"{why} {during} on {w.uuid}: work done while stopped slows what the guard measures then"
        if not accuse:
            raise Unpaired(reason, "REWARD_HACK") from failed
        raise StoppedButRan("benchmark", "REWARD_HACK", reason, None, w.uuid) from failed
    if failed is not None:
        raise failed


# what the guard adds to a workload's figures itself; a candidate's process that sends them is ignored
_GUARD_FIGURES = ("outside_clock", "floored_by_outside_clock", "inside_median_ms")


def _reported_figures(raw: dict[str, Any], w: Workload) -> dict[str, Any]:
    """The figures the candidate's process reported, as the verdict's ``Timing`` types them:
    a figure of the wrong type (a red team's relative standard error as a string) raised in
    the guard and withheld the verdict: out of protocol, REWARD_HACK. Only the fields
    ``Timing`` names are kept (another, nested 600 deep, went into the verdict and could not
    be stored; 250 deep, it was stored and could not be read back); the guard adds its own."""
    named = set(Timing.model_fields) - set(_GUARD_FIGURES)
    try:
        figures = Timing.model_validate({k: v for k, v in raw.items() if k in named}, strict=True)
    except ValidationError as exc:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker reported the timing of {w.uuid} out of protocol: "
            f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}: {exc.errors()[0]['msg']}",
            None,
            w.uuid,
        ) from None
    # its texts (the method, why CUPTI or a graph failed) shown, not read: a line each at most
    return {k: v[:300] if isinstance(v, str) else v for k, v in figures.model_dump(exclude_none=True).items()}


def _check_figures(stats: dict[str, Any], w: Workload) -> None:
    """The figures the candidate's process reports must be possible: a median of zero or
    less (or not a number) dropped its workload from every comparison, and with all of them
    gone a candidate became the global best with nothing to compare (a red team's forgery)."""
    median, rel_se = stats.get("median_ms"), stats.get("rel_se") or 0.0
    if (
        not isinstance(median, (int, float))
        or not math.isfinite(median)
        or median <= 0
        or not math.isfinite(rel_se)
        or rel_se < 0
    ):
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the timing of {w.uuid} reported by the candidate's process is impossible "
            f"(median {median!r} ms, relative standard error {rel_se!r}): its figures were forged",
            None,
            w.uuid,
        )


def _outside_figure_floors(ref: ReferenceSide, host_bound: bool) -> bool:
    """Whether the outside figure is a floor under the decided one (``_floor_by_outside_clock``):
    on the CPU, whose band cannot hold the candidate's own median to it, and on a GPU whose loop
    the host paces (``_pad_passes``), where the outside figure holds host time that the
    candidate's device span does not."""
    return ref.device.kind != "cuda" or host_bound


def _floor_by_outside_clock(stats: dict[str, Any], clock: outside_clock.OutsideClock) -> None:
    """On a CPU the candidate's own median (its process's clock) cannot be held to the outside
    clock's band, which must be wide there (100% + 5 ms: a loaded machine stalls windows), while
    calls take a fraction of a millisecond: a red team halved its medians and was ACCEPTed. The
    figure that decides is therefore never below what the guard's own clock saw per call; the
    candidate's own median is kept beside it (``inside_median_ms``). Tampering can then only
    make a CPU figure slower. A GPU keeps CUPTI's figure, held to a 10% band, except where its
    loop is host-bound: there an honest eager call's host time is in the outside figure and not
    in its span (a Triton call of two launches: 106 us outside, 9 us inside, on the H200), and
    the guard's figure, which is never below the call's device time, decides."""
    inside = float(stats["median_ms"])
    if clock.outside_ms > inside:
        stats["inside_median_ms"] = inside
        stats["median_ms"] = clock.outside_ms
        stats["floored_by_outside_clock"] = True


def _loop_kind(ref: ReferenceSide, d: Definition, w: Workload) -> str:
    """ "captured" where the outside clock's loop draws and digests in graphs (a GPU, inputs
    the guard draws itself), else "eager"; decided here from the problem alone, and both
    workers' loops follow the same rule (``ConfirmLoop``)."""
    possible = stream_refill_possible(d.model_dump(mode="json"), w.model_dump(mode="json"))
    return "captured" if ref.device.kind == "cuda" and possible else "eager"


def _bands(ref: ReferenceSide, loop: str) -> tuple[float, float, float]:
    c = ref.cfg
    if ref.device.kind != "cuda":
        return c.outside_rel_band_cpu, c.outside_abs_band_ms_cpu, c.outside_loop_slack_cpu
    if loop == "captured":
        return c.outside_rel_band, c.outside_abs_band_ms, c.outside_loop_slack
    return c.outside_rel_band, c.outside_abs_band_ms_host, c.outside_loop_slack_host


def _pad_passes(ref: ReferenceSide, host_ms: float, flush_ms: float) -> tuple[int, float, bool]:
    """Flush passes before each iteration of the outside clock's loop, about how long they
    take, and whether the cap cut them short: enough for the host to enqueue one iteration
    meanwhile, so the device never waits for it. Both workers queue the same count. The
    figures come from the candidate's process, hence the cap (padding widens the band): too
    little padding only makes its own loop slower. Cut short, the loop is host-bound by the
    candidate's own account, and its outside figure floors the decided one
    (``_outside_figure_floors``): a candidate that overstates its host time to get there is
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


@dataclass
class _Workload:
    """What every request about the workload being timed carries."""

    ref: ReferenceSide
    worker: WorkerProcess
    trusted: WorkerProcess
    key: str
    d: Definition
    w: Workload
    workload: dict[str, Any]
    axes: dict[str, int]
    sets: list[int]
    timeout: float


def time_workload(
    ref: ReferenceSide,
    worker: WorkerProcess,
    trusted: WorkerProcess,
    key: str,
    d: Definition,
    w: Workload,
    sets: list[int],
    run_seed: int,
    dps: bool,
    check_rng: random.Random,
) -> dict[str, Any]:
    """{"stats": ..., "nvml": ...} for one workload, or a Rejection."""
    cfg = ref.cfg
    cx = _Workload(
        ref,
        worker,
        trusted,
        key,
        d,
        w,
        w.model_dump(mode="json"),
        d.resolve_axes(w.axes),
        sets,
        cfg.call_timeout_s + cfg.max_timing_s,
    )
    # as the correctness gate compares: the workload's own spec (a matched ratio too) or the guard's
    tolerances = [m.Tolerance.model_validate(t.message()) for t in tolerance_mod.for_workload(d, w).values()]

    timing = ref.timing_config()
    projection_seed = ref.seed("confirm-projection", run_seed)
    # a CPU's loop holds its calls' outputs for the guard to read (``held_outputs``): as many as fit
    held = (
        0
        if ref.device.kind == "cuda"
        else held_outputs.held_calls(d, w, cfg.confirm_held_max_bytes, cfg.confirm_held_max_calls)
    )
    armed = _call(
        worker,
        m.Arm(
            workload=cx.workload,
            axes=cx.axes,
            sets=sets,
            call_bytes=sum(memory_plan.tensor_bytes(d, w)),
            arm_seed=ref.seed("arm", run_seed),
            config=timing,
            tolerances=tolerances,
            confirm_projection_seed=projection_seed,
            confirm_rows=held,
        ),
        m.ArmReply,
        cx.timeout,
    )
    if not armed.ok or armed.plan is None:
        raise _failed(armed, w, "warming up")

    before = nvml.snapshot(ref.device.uuid) if ref.device.kind == "cuda" else None
    t0 = time.monotonic()
    ran = _call(worker, m.Run(run_seed=run_seed, max_timing_s=cfg.max_timing_s), m.RunReply, cx.timeout)
    run_s = time.monotonic() - t0
    after = nvml.snapshot(ref.device.uuid) if ref.device.kind == "cuda" else None
    if not ran.ok:
        raise _failed(ran, w, "timing")
    n = len(ran.digests)
    _check_counts(armed.plan, n, run_s, timing, cfg.max_timing_s, w)
    # The digests of a secret sample of the calls of every loop are checked against the
    # reference; the timed loop's while the candidate's worker reads its profiler's records
    # (host work only: nothing is timed meanwhile).
    reading = Asked(worker, m.Stats(), m.StatsReply, "benchmark")
    try:
        chosen = sorted(check_rng.sample(range(n), min(cfg.replay_checks, n)))
        _verify_calls(
            cx,
            run_seed,
            "seeded",
            projection_seed,
            chosen,
            [ran.digests[i] for i in chosen],
            tolerances,
            list(d.outputs),
            "timed",
        )
    except BaseException:
        reading.drop(cx.timeout)
        raise
    got = reading.reply(cx.timeout)
    if not got.ok:
        raise _failed(got, w, "reading the timing of")
    stats = _reported_figures(got.stats, w)
    _check_figures(stats, w)

    loop_kind = _loop_kind(ref, d, w)
    try:
        passes, pad, host_bound = _pad_passes(ref, armed.confirm_host_ms, armed.flush_ms)
    except ValueError as exc:
        raise Rejection("benchmark", "REWARD_HACK", f"warming up {w.uuid}: {exc}", None, w.uuid) from None
    copies = armed.plan.method != "cuda-graph" and not dps
    rel, abs_ms, slack = _bands(ref, loop_kind)

    n_loop = min(n, held) if held else n
    if held:  # enough calls that a window's own fixed cost is small beside them
        n_loop = _calls_per_window(cx, run_seed, n_loop, held)

    def judge(run_walls: list[float], loop_walls: list[float]) -> outside_clock.OutsideClock:
        # pauses (a collection, the scheduler) only lengthen a window: the shortest of each is the loop
        return outside_clock.judge(
            min(run_walls),
            n_loop,
            min(loop_walls),
            n_loop,
            outside_clock.inside_figure_ms(stats),
            rel,
            abs_ms,
            slack,
            loop_kind,
            pad,
            check_short=ref.device.kind == "cuda",
            host_bound=host_bound,
        ).model_copy(update={"windows": len(run_walls)})

    floors = _outside_figure_floors(ref, host_bound)
    try:  # the outputs read out of the candidate's worker go when this workload is done
        run_walls, loop_walls, confirms, clock = _outside_windows(
            cx, run_seed, n_loop, passes, copies, projection_seed, judge, floors, check_rng
        )
        target = cfg.outside_window_s_cpu
        longer = held_outputs.longer_windows(n_loop, min(run_walls), clock.outside_ms, target, held) if held else None
        if longer is not None:
            n_loop = longer
            run_walls, loop_walls, confirms, clock = _outside_windows(
                cx, run_seed, n_loop, passes, copies, projection_seed, judge, floors, check_rng
            )
        stats["outside_clock"] = clock.model_dump()
        if floors:
            _floor_by_outside_clock(stats, clock)

        # every window's calls checked as many as the timed loop's: the shortest window decides
        for c in confirms:
            _verify_calls(
                cx,
                c.seed,
                "stream",
                projection_seed,
                c.chosen,
                c.digests,
                tolerances,
                list(d.outputs),
                "outside clock's",
                c.read,
            )
    finally:
        shutil.rmtree(cx.trusted.workdir / "read", ignore_errors=True)
    _reject_disagreement(cx, clock, run_walls, loop_walls, n_loop)
    return {"stats": stats, "nvml": {"before": before, "after": after}}


def _calls_per_window(cx: _Workload, run_seed: int, calls: int, most: int) -> int:
    """A CPU: the calls per window of the outside clock's loop, from one loop of ``calls`` timed by
    the guard's clock (its outputs are not read: the windows that decide come after, on their own
    data). Only a loop that is slower than it need be lengthens it: a candidate gains nothing."""
    target = cx.ref.cfg.outside_window_s_cpu
    if calls >= most or target <= 0:
        return calls
    seed = cx.ref.seed("confirm-probe", run_seed)
    with _no_gc():
        t0 = time.monotonic()
        probe = _call(cx.worker, m.Confirm(seed=seed, iters=calls), m.ConfirmReply, cx.timeout)
        wall = time.monotonic() - t0
    if not probe.ok:
        raise _failed(probe, cx.w, "timing")
    return held_outputs.calls_for_window(calls, wall, target, most)


def _outside_windows(
    cx: _Workload,
    run_seed: int,
    n: int,
    passes: int,
    copies: bool,
    projection_seed: int,
    judge: Callable[[list[float], list[float]], outside_clock.OutsideClock],
    floors: bool,
    check_rng: random.Random,
) -> tuple[list[float], list[float], list[_Checked], outside_clock.OutsideClock]:
    """The outside clock: the candidate's loop of calls, then the same loop without the call in
    the trusted worker while the candidate's processes are stopped; each window on new data,
    as many as ``outside_clock.run_windows`` decides (more only while ``judge`` finds the figure
    contradicted). (walls of the candidate's loops, walls of the trusted loops, the calls to
    check per window, the judgement on all the windows run).

    On a CPU the loop holds its outputs in the candidate's worker (``held_outputs``): the
    candidate's window ends when its whole tree is stopped, not when it replies (a thread that
    went on computing after the reply would otherwise do its work off the clock), the chosen
    calls' outputs are read out of it then, and the trusted window ends the same way. Each
    window is charged its wall time plus the CPU time its tree used beside its busiest thread
    (``runner.tree_cpu``): calls run on a second core while the loop drew are paid for."""
    ref, w = cx.ref, cx.w
    held = ref.device.kind != "cuda"
    run_walls: list[float] = []  # charged: wall time, and CPU time on other cores (a CPU)
    run_parallel: list[float] = []
    loop_walls: list[float] = []
    confirms: list[_Checked] = []
    most = ref.cfg.outside_windows if ref.device.kind == "cuda" else ref.cfg.outside_windows_cpu

    run_pid = cx.worker.proc.pid if cx.worker.proc is not None else None
    loop_pid = cx.trusted.proc.pid if cx.trusted.proc is not None else None

    def window() -> outside_clock.OutsideClock:
        seed = ref.seed(f"confirm-{len(run_walls)}", run_seed)
        chosen = sorted(check_rng.sample(range(n), min(ref.cfg.replay_checks, n)))
        cpu0 = tree_cpu.read(run_pid if held else None)
        with _no_gc():
            t0 = time.monotonic()
            confirmed = _call(
                cx.worker, m.Confirm(seed=seed, iters=n, pad_passes=passes, copies=copies), m.ConfirmReply, cx.timeout
            )
            run_wall = time.monotonic() - t0
        if not confirmed.ok:
            raise _failed(confirmed, w, "timing")
        calls = len(confirmed.held) if held else len(confirmed.digests)
        if calls != n:
            raise Rejection(
                "benchmark",
                "REWARD_HACK",
                f"the outside clock's loop on {w.uuid} reported {calls} calls for {n}",
                None,
                w.uuid,
            )
        read = None
        parallel = 0.0
        with candidate_stopped(cx.worker, w, "while the guard timed its loop without the call"):
            if held:
                run_wall, parallel = _charged(time.monotonic() - t0, cpu0, run_pid, w)
                dest = cx.trusted.workdir / "read" / f"window{len(run_walls)}"
                read = held_outputs.read_chosen(cx.worker, confirmed, chosen, cx.d, w, dest)
            wait_device_idle(ref, cx.trusted, w, "before the guard's loop")
            loop_cpu0 = tree_cpu.read(loop_pid if held else None)
            with _no_gc():
                t0 = time.monotonic()
                loop = _call(
                    cx.trusted,
                    m.Overhead(
                        key=cx.key,
                        workload=cx.workload,
                        axes=cx.axes,
                        sets=cx.sets,
                        seed=seed,
                        iters=n,
                        pad_passes=passes,
                        copies=copies,
                        projection_seed=projection_seed,
                    ),
                    m.OverheadReply,
                    cx.timeout,
                )
                loop_wall = time.monotonic() - t0
                if held:  # ended and charged as the candidate's window was
                    with frozen(loop_pid):
                        loop_wall = tree_cpu.charged_s(time.monotonic() - t0, loop_cpu0, tree_cpu.read(loop_pid))
            wait_device_idle(ref, cx.trusted, w, "after the guard's loop")
        if not loop.ok:
            raise GuardError(f"the trusted worker could not run the timing loop: {loop.message}")
        run_walls.append(run_wall)
        run_parallel.append(parallel)
        loop_walls.append(loop_wall - loop.setup_s)
        digests = [] if held else [confirmed.digests[i] for i in chosen]
        confirms.append(_Checked(seed, chosen, digests, read))
        shortest = min(range(len(run_walls)), key=run_walls.__getitem__)
        return judge(run_walls, loop_walls).model_copy(update={"parallel_s": run_parallel[shortest]})

    clock = outside_clock.run_windows(window, ref.cfg.outside_windows_first, most, floors, ref.pool.quiet_spare)
    return run_walls, loop_walls, confirms, clock


def _charged(wall_s: float, before: tree_cpu.TreeCpu, pid: int | None, w: Workload) -> tuple[float, float]:
    """A CPU window of the candidate's that ends now (its tree stopped): (what it is charged,
    the part of that its tree ran on other cores beside its busiest thread). A window in which
    a process of the tree ended is REWARD_HACK: what that process ran cannot be counted."""
    after = tree_cpu.read(pid)
    if gone := tree_cpu.vanished(before, after):
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"processes {gone} of the candidate's tree ended while the guard's clock timed its loop on "
            f"{w.uuid}: the CPU time they used cannot be charged",
            None,
            w.uuid,
        )
    parallel = tree_cpu.parallel_ns(before, after) / 1e9
    return wall_s + parallel, parallel


@dataclass
class _Checked:
    """One window's calls to check: their seed, which, and their digests (a GPU) or outputs as
    the guard read them (a CPU)."""

    seed: int
    chosen: list[int]
    digests: list[Any]
    read: list[list[m.ReadOutput | None]] | None


def _verify_calls(
    cx: _Workload,
    seed: int,
    regime: Literal["seeded", "stream"],
    projection_seed: int,
    chosen: list[int],
    digests: list[Any],
    tolerances: list[m.Tolerance],
    names: list[str],
    loop_name: str,
    read: list[list[m.ReadOutput | None]] | None = None,
) -> None:
    """The trusted worker's check of the chosen calls' digests (``digests``, one per chosen
    call), or of their outputs as the guard read them (``read``); REWARD_HACK on a mismatch."""
    w = cx.w
    verified = _call(
        cx.trusted,
        m.VerifyReplays(
            key=cx.key,
            workload=cx.workload,
            axes=cx.axes,
            sets=cx.sets,
            run_seed=seed,
            regime=regime,
            projection_seed=projection_seed,
            iterations=chosen,
            digests=digests,
            tolerances=tolerances,
            names=names,
            read=read,
        ),
        m.VerifyReply,
        max(cx.ref.cfg.call_timeout_s, 120),
    )
    if not verified.ok:
        raise GuardError(f"checking the timed calls on {w.uuid} failed: {verified.message}")
    if not verified.passed:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"{loop_name} call {verified.iteration} on {w.uuid} did not compute the answer for its "
            "own inputs: the candidate behaves differently while timed (every timed call gets "
            "fresh inputs; a remembered answer, a cache or a skipped call fails)",
            verified.message,
            w.uuid,
        )


def _reject_disagreement(
    cx: _Workload, clock: outside_clock.OutsideClock, run_walls: list[float], loop_walls: list[float], n: int
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


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """No collection in the guard's process while its clock runs around a window."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _failed(reply: m.Reply, w: Workload, doing: str) -> Exception:
    if reply.status == "INTERNAL":
        log.warning("the candidate's worker failed in its own step while %s %s: %s", doing, w.uuid, reply.message)
    status = candidate_status(reply.status)
    return Rejection(
        "benchmark",
        status,
        f"{status} while {doing} {w.uuid}: {first_line(reply.message or '')}",
        reply.message,
        w.uuid,
    )
