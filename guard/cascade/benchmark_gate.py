"""Gate 4: timing the visible workloads (held-out ones are never timed), each through the
trusted protocol of ``timed_workload`` (fresh data for every call, digests checked, the
guard's own clock); and the paired re-measurement of an incumbent and the challenger, timed
turn about on the same inputs. The loops themselves run in the workers
(guard/runner/timing.py)."""

from __future__ import annotations

import json
import random
import sqlite3
from typing import Any, Literal

from ..pairing import PairedSamples, pairing_rounds
from ..runner.pool import WorkerPool
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .context import EvalContext
from .build_gate import build
from .reasons import GuardError, Rejection, Unpaired, first_line, worker_failed
from .timed_workload import time_workload
from .workload_requests import candidate_stopped, wait_device_idle


def _dps(solution: dict[str, Any]) -> bool:
    return bool((solution.get("spec") or {}).get("destination_passing_style", False))


def benchmark(ctx: EvalContext) -> dict[str, dict[str, Any]]:
    """workload uuid -> {"stats": ..., "nvml": ...} for the visible workloads."""
    ref, cfg, d, visible, progress = ctx.ref, ctx.cfg, ctx.definition, ctx.visible, ctx.progress
    rng = random.Random(ctx.eval_seed)
    results: dict[str, dict[str, Any]] = {}
    with ref.hold(True, progress):
        for i, w in enumerate(visible):
            progress("benchmark", i, len(visible), w.uuid)
            sets = ref.set_seeds(d, w, "timing", ctx.eval_seed)
            run_seed = ref.seed("run", ctx.eval_seed, w.uuid)
            results[w.uuid] = time_workload(ref, ctx.cand, ctx.trusted, ctx.key, d, w, sets, run_seed, ctx.dps, rng)
    progress("benchmark", len(visible), len(visible), "timed")
    return results


def _set_up_incumbent(ctx: EvalContext, inc: WorkerProcess, incumbent: sqlite3.Row) -> None:
    """The incumbent's worker started and its candidate built again, or Unpaired. Its build
    failing is its own doing (a build answered out of protocol is its REWARD_HACK, as a
    challenger's is; an import that failed only when built again kept another agent's title
    before: red team, session 45; an environment that changed cannot be told from it). The
    challenger is stopped meanwhile, so that it cannot make that build fail or time out by
    taking the cores (review, session 45). A worker that does not start ran none of the
    incumbent's code: no status."""
    try:
        inc.wait_ready(180)
    except (WorkerDied, WorkerTimeout) as exc:
        raise Unpaired(f"no worker for the incumbent {incumbent['id']} could be started: {exc}") from None
    solution = json.loads(incumbent["solution_json"])
    with candidate_stopped(ctx.cand, None, "while the incumbent was built again"):
        try:
            reply = build(inc, ctx.problem, solution, incumbent["language"], ctx.cfg)
        except GuardError as exc:  # its worker's own set-up: the stored measurement decides
            raise Unpaired(f"the incumbent {incumbent['id']} could not be set up: {exc}") from None
    if not reply.ok:
        raise Unpaired(
            f"the incumbent {incumbent['id']} does not build here: {first_line(reply.message or '')}",
            reply.status or "COMPILE_ERROR",
        )


def remeasure(ctx: EvalContext, pool: WorkerPool, incumbent: sqlite3.Row) -> dict[str, PairedSamples]:
    """Time the incumbent (a stored candidate row) and the challenger turn about (I C C I ...,
    ``pairing_rounds`` turns each) on the same inputs, each worker writing to its own folder.
    Returns workload -> paired samples, or raises Unpaired when the incumbent cannot be run
    again (then the stored measurement decides). Its status names the incumbent's own failure
    (it does not build, raises, dies, hangs or answers out of protocol): another agent's global
    best that spoils its re-measurement so keeps no title (``pairing_gate``). None is left for
    what the guard, the device or the machine may cause: no process to be had, a worker that
    cannot start or be set up, a device that stays busy."""
    ref, cfg, problem, visible, progress = ctx.ref, ctx.cfg, ctx.problem, ctx.visible, ctx.progress
    rounds = pairing_rounds(len(visible), cfg)
    d = problem.definition
    try:  # none starts while the pair is timed (``WorkerPool.take_candidate``)
        inc = pool.take_candidate()
    except OSError as exc:  # no process to be had (the challenger may have taken them all): unpaired
        raise Unpaired(f"no worker could be started for the incumbent {incumbent['id']}: {exc}") from None
    try:
        _set_up_incumbent(ctx, inc, incumbent)
        dps = {"incumbent": _dps(json.loads(incumbent["solution_json"])), "challenger": ctx.dps}
        rng = random.Random(ctx.eval_seed ^ 0x5A5A)
        samples: dict[str, PairedSamples] = {}
        with ref.hold(True, progress):
            for i, w in enumerate(visible):
                progress("pairing", i, len(visible), f"{w.uuid} against {incumbent['id']}")
                sets = ref.set_seeds(d, w, "pairing", ctx.eval_seed)
                s = samples[w.uuid] = {"incumbent": [], "challenger": []}
                for rep in range(rounds):
                    order: list[tuple[Literal["incumbent", "challenger"], WorkerProcess]] = [
                        ("incumbent", inc),
                        ("challenger", ctx.cand),
                    ]
                    # both on the same data: the same seeds for the sets and the timed calls
                    run_seed = ref.seed("pairing-run", ctx.eval_seed, w.uuid, rep)
                    for role, worker in order if rep % 2 == 0 else order[::-1]:
                        other = inc if worker is ctx.cand else ctx.cand
                        # the other candidate stopped, and its queued device work drained, while
                        # this one is timed: neither can slow what it is compared with
                        accuse = other is ctx.cand  # the challenger's doing; the incumbent's: unpaired
                        with candidate_stopped(other, w, "while the other candidate was timed", accuse):
                            try:
                                wait_device_idle(ref, ctx.trusted, w, "before the other candidate was timed")
                            except Rejection as rej:
                                # Work that will not drain: the stopped one may have queued it, or
                                # the one about to be timed, which is not stopped (a thread of its
                                # own can launch at any time). Neither is blamed, so that neither
                                # can get the other accused or revoked; unpaired, an unclear
                                # comparison gives no ACCEPT (recording.measured).
                                raise Unpaired(f"the device was busy before {role}'s turn: {rej.reason}") from None
                            try:
                                t = time_workload(
                                    ref, worker, ctx.trusted, ctx.key, d, w, sets, run_seed, dps[role], rng
                                )
                            except Rejection as rej:
                                if role == "challenger":
                                    raise
                                raise Unpaired(f"the incumbent failed to run again: {rej.reason}", rej.status) from None
                        s[role].append((t["stats"]["median_ms"], t["stats"].get("rel_se") or 0.0))
        progress("pairing", len(visible), len(visible), "paired")
        return samples
    except (WorkerDied, WorkerTimeout) as exc:
        if not ctx.cand.alive:
            # the challenger's worker died or hung while timed again: its own failure, judged as
            # in the benchmark (not a reason to fall back on the stored figures, which a
            # candidate that aborts when re-measured would otherwise choose)
            raise
        # The incumbent's own failure, judged as a challenger's would be (``reasons``): bytes that
        # are no message are its REWARD_HACK, a death its RUNTIME_ERROR, a hang its TIMEOUT. With no
        # status, another agent's global best that exited or hung when timed again kept its title
        # against every challenger inside the band (red team, session 45).
        # A worker that hangs is killed, so a live incumbent's failure was the trusted worker's.
        status = None if inc.alive else worker_failed("pairing", exc, ctx.cfg.call_timeout_s).status
        raise Unpaired(f"re-measuring {incumbent['id']} failed: {exc}", status) from None
    except GuardError as exc:
        # The guard's own failure while the pair was timed (the trusted worker could not check
        # a turn, say): nobody is blamed, and the challenger's verdict stands on its benchmark.
        # Raised on, it withheld that verdict altogether (red team, session 45, read).
        raise Unpaired(f"the guard could not time {incumbent['id']} again: {exc}") from None
    finally:
        pool.discard(inc)
