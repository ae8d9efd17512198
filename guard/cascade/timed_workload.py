"""Timing one workload so that the figure can be trusted, in these requests:

1. ``arm`` (candidate worker): live input sets, warm-up, graph capture, the loop's plan;
2. ``run`` (candidate worker): the timed loop on the data of a seed it learns only now, every
   call on fresh inputs with its outputs scrambled first and, on a GPU, digested after (a
   CPU's outputs are held, and the guard reads the chosen calls' itself: ``timed_reads``); then ``stats``
   (the profiler stopped and its records read), while the trusted worker checks a secret
   sample of the loop's digests (as in 5) and, on a GPU, builds the loop of 4 (``prepare_loop``);
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

import logging
import math
import random
import shutil
import time
from typing import Any, Literal

from pydantic import ValidationError

from .. import outside_clock
from . import cpu_windows, held_outputs, memory_plan, outside_windows, timed_reads
from ..problems import tolerance as tolerance_mod
from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner import nvml
from ..runner.refill_kinds import stream_refill_possible
from ..runner.process import WorkerProcess
from .asking import Asked
from .reasons import GuardError, Rejection
from ..verdict import Timing
from .reference_side import ReferenceSide
from .workload_requests import WorkloadContext, call, failure

log = logging.getLogger(__name__)


def _check_counts(plan: m.Plan, n: int, run_s: float, timing: m.TimingConfig, max_timing_s: float, w: Workload) -> None:
    """The counts come from the candidate's process: the plan must lie within the guard's
    bounds, and a loop may stop short of it only when the guard's own clock saw it run for
    the time limit. The outside clock's loop runs at least the same count (more where
    ``outside_windows.window_calls`` asks), and a short one would put a window's fixed costs
    into every call's share of the band."""
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


# no call is shorter than a nanosecond; none is longer than the time its whole request had
FASTEST_CALL_MS = 1e-6


def _check_figures(stats: dict[str, Any], w: Workload, slowest_ms: float) -> None:
    """The figures the candidate's process reports must be possible: a median of zero or
    less (or not a number) dropped its workload from every comparison, and with all of them
    gone a candidate became the global best with nothing to compare (a red team's forgery).
    One beyond what a call can take (``slowest_ms``: the whole request's limit) made the
    pairing's arithmetic overflow, and the guard raised with no verdict (red team, session
    45: 1.79e308 ms reported only when timed again)."""
    median, rel_se = stats.get("median_ms"), stats.get("rel_se") or 0.0
    if (
        not isinstance(median, (int, float))
        or not math.isfinite(median)
        or not FASTEST_CALL_MS <= median <= slowest_ms
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


def _loop_kind(ref: ReferenceSide, d: Definition, w: Workload) -> str:
    """ "captured" where the outside clock's loop draws and digests in graphs (a GPU, inputs
    the guard draws itself), else "eager"; decided here from the problem alone, and both
    workers' loops follow the same rule (``ConfirmLoop``)."""
    possible = stream_refill_possible(d.model_dump(mode="json"), w.model_dump(mode="json"))
    return "captured" if ref.device.kind == "cuda" and possible else "eager"


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
    cx = WorkloadContext(
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

    cpu = ref.device.kind != "cuda"
    timing = ref.timing_config()
    projection_seed = ref.seed("confirm-projection", run_seed)
    # a CPU's loops hold their calls' outputs for the guard to read (``held_outputs``): as many as
    # fit, the outside clock's with each call's inputs beside them, the timed loop's without
    held = held_outputs.held_calls(d, w, cfg.confirm_held_max_bytes, cfg.confirm_held_max_calls) if cpu else 0
    if cpu:
        timing = held_outputs.timed_calls_capped(timing, d, w, cfg.confirm_held_max_bytes)
    armed = call(
        worker,
        m.Arm(
            workload=cx.workload,
            axes=cx.axes,
            sets=sets,
            call_bytes=sum(memory_plan.tensor_bytes(d, w)),
            arm_seed=ref.seed("arm", run_seed),
            config=timing,
            tolerances=tolerances,
            # a CPU's loops digest nothing: no secret of their checks goes to the candidate
            confirm_projection_seed=0 if cpu else projection_seed,
            confirm_rows=held,
            confirm_least=outside_windows.least_loop_calls(ref),
        ),
        m.ArmReply,
        cx.timeout,
    )
    if not armed.ok or armed.plan is None:
        raise failure(armed, w, "warming up")
    try:
        passes, pad, host_bound = outside_windows.pad_passes(ref, armed.confirm_host_ms, armed.flush_ms)
    except ValueError as exc:
        raise Rejection("benchmark", "REWARD_HACK", f"warming up {w.uuid}: {exc}", None, w.uuid) from None

    before = nvml.snapshot(ref.device.uuid) if ref.device.kind == "cuda" else None
    t0 = time.monotonic()
    ran = call(worker, m.Run(run_seed=run_seed, max_timing_s=cfg.max_timing_s), m.RunReply, cx.timeout)
    run_s = time.monotonic() - t0
    after = nvml.snapshot(ref.device.uuid) if ref.device.kind == "cuda" else None
    if not ran.ok:
        raise failure(ran, w, "timing")
    n = len(ran.held) if cpu else len(ran.digests)
    _check_counts(armed.plan, n, run_s, timing, cfg.max_timing_s, w)
    # the outside clock's calls a window (a CPU's are set by its first window, below)
    n_loop = min(n, held) if held else outside_windows.window_calls(ref, n, armed.confirm_host_ms, host_bound)
    chosen = sorted(check_rng.sample(range(n), min(cfg.replay_checks, n)))
    # A CPU's timed calls: the chosen ones' outputs read by the guard, its tree stopped, before
    # the worker is asked for anything else (``timed_reads``); a GPU's: their digests.
    timed_dir = cx.trusted.workdir / "read" / "timed"
    copies = armed.plan.method != "cuda-graph" and not dps
    try:
        read = timed_reads.read_chosen(cx, ran, chosen, timed_dir) if cpu else None
        # The secret sample of the calls of every loop is checked against the reference; the
        # timed loop's while the candidate's worker reads its profiler's records (host work
        # only: nothing is timed meanwhile).
        reading = Asked(worker, m.Stats(), m.StatsReply, "benchmark")
        try:
            _verify_calls(
                cx,
                run_seed,
                "seeded",
                projection_seed,
                chosen,
                [] if cpu else [ran.digests[i] for i in chosen],
                tolerances,
                list(d.outputs),
                "timed",
                read,
            )
            if not cpu:  # the trusted loop's set-up, here rather than while the candidate is stopped
                _prepare_trusted_loop(cx, n_loop, copies, projection_seed)
        except BaseException:
            reading.drop(cx.timeout)
            raise
    finally:
        shutil.rmtree(timed_dir, ignore_errors=True)
    got = reading.reply(cx.timeout)
    if not got.ok:
        raise failure(got, w, "reading the timing of")
    stats = _reported_figures(got.stats, w)
    _check_figures(stats, w, cx.timeout * 1e3)

    loop_kind = _loop_kind(ref, d, w)
    rel, abs_ms, slack = outside_windows.bands(ref, loop_kind)

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

    floors = outside_windows.figure_floors(ref, host_bound)

    def windows(
        n: int, first: int = 0, **how: Any
    ) -> tuple[list[float], list[float], list[outside_windows.Checked], outside_clock.OutsideClock]:
        """The outside clock's windows of ``n`` calls, after ``first`` windows already run on
        this workload (``outside_windows.run_windows``; ``how``: floors, paced, most, loops)."""
        return outside_windows.run_windows(
            cx, run_seed, n, passes, copies, projection_seed, judge, how.pop("floors", floors), check_rng, first, **how
        )

    try:  # the inputs written and the outputs read out of the candidate's worker go when this workload is done
        if held:  # enough calls that a window's own fixed cost is small beside them
            n_loop = cpu_windows.calls_per_window(cx, run_seed, n_loop, held, copies, projection_seed)
        run_walls, loop_walls, confirms, clock = windows(n_loop)
        target = cfg.outside_window_s_cpu
        longer = held_outputs.longer_windows(n_loop, min(run_walls), clock.outside_ms, target, held) if held else None
        if longer is not None:  # too short to time: longer windows decide, the first are checked too
            n_loop = longer
            first = confirms
            run_walls, loop_walls, confirms, clock = windows(n_loop, len(first))
            confirms = first + confirms
        if held and cfg.outside_paced_share_cpu > 0:  # one window whose calls cannot be batched
            _, _, paced_confirms, paced = windows(
                n_loop, len(confirms), floors=False, paced=True, most=1, loops=cfg.outside_paced_loops_cpu
            )
            confirms = confirms + paced_confirms
            clock = clock.model_copy(
                update={
                    "paced_ms": paced.outside_ms,
                    "paced_share": cfg.outside_paced_share_cpu,
                    "paced_loops": paced.loop_windows,
                }
            )
        stats["outside_clock"] = clock.model_dump()
        if floors:
            outside_windows.floor_by_outside_clock(stats, clock)

        # every window's calls checked as many as the timed loop's, the shortest window deciding
        # and the others too: a window whose walls are not used could otherwise skip its work
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
        shutil.rmtree(cx.trusted.workdir / "staged", ignore_errors=True)
    outside_windows.reject_disagreement(cx, clock, run_walls, loop_walls, n_loop)
    return {"stats": stats, "nvml": {"before": before, "after": after}}


def _prepare_trusted_loop(cx: WorkloadContext, n: int, copies: bool, projection_seed: int) -> None:
    """The trusted worker builds the outside clock's loop without the call (``m.PrepareLoop``)
    while the candidate's worker reads its timed loop's figures: its set-up was taken out of the
    outside figure anyway (``setup_s``), but cost the verdict's wall inside the freeze. Only a
    head start: where it fails (out of memory beside the live candidate, say) the first window's
    ``Overhead`` builds the loop as before, with the candidate stopped, and the candidate's own
    figures and checks decide as if it had not been asked (a review of ours, session 47)."""
    prepared = call(
        cx.trusted,
        m.PrepareLoop(**cx.trusted_fields(), iters=n, copies=copies, projection_seed=projection_seed),
        m.Reply,
        cx.timeout,
    )
    if not prepared.ok:
        log.info("the trusted loop of %s is built at its first window: %s", cx.w.uuid, prepared.message)


def _verify_calls(
    cx: WorkloadContext,
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
    verified = call(
        cx.trusted,
        m.VerifyReplays(
            **cx.trusted_fields(),
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
