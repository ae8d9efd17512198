"""A file's analysis from start to end: the base point, the axes, then CPU workloads derived
and run until one works (or why none does)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ..derive import CPU_ELEMENT_BUDGET, cpu_workloads
from ..kernelbench_import import build_problem
from .axes import Analysis
from .failures import ProbeFailure
from .interface import Prober
from .verify import CPU_FLOP_BUDGET, CPU_FLOP_HARD_CAP, MIN_ELEMENT_BUDGET, verify_on_cpu


def smallest_working(an: "Analysis", a: str, failing: int) -> int | None:
    """The smallest size of ``a``'s halving chain (full, full/2, ...) above ``failing`` at
    which the model still runs with every other constant at its base size (binary search
    between the smallest size known to work and ``failing``); None if none does."""
    full = an.base_axes[a]
    known = an.known_ok.get(a, full)
    chain = []
    v = full
    while v > failing:
        if v < known:
            chain.append(v)
        v //= 2
    lo, hi = -1, len(chain)  # chain[:lo+1] work (assumed monotonic), chain[hi:] fail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            an._run(an._at({a: chain[mid]}))
            lo = mid
        except ProbeFailure:
            hi = mid
    if lo >= 0:
        return chain[lo]
    return known if known < full else None


def analyze(path: str, opts: dict[str, Any] | None = None) -> dict[str, Any]:
    opts = opts or {}

    t0 = time.perf_counter()
    prober = Prober(path)
    an = Analysis(prober, opts)
    an.base()
    t_base = time.perf_counter()
    an.dependencies()
    sym = an.symbols()
    t_deps = time.perf_counter()
    attempts: list[dict[str, Any]] = []
    reduced: set[str] = getattr(an, "reduced", set())
    budget = CPU_ELEMENT_BUDGET
    prev_flops = None
    for _ in range(12):
        spec = an.spec(sym, budget)
        problem, _ = build_problem(Path(path), prober.source, prober.consts, spec)
        d = problem.definition
        cpu = cpu_workloads(d, problem.workloads)[0]
        axes = d.resolve_axes(cpu.axes)
        consts = {a: axes[a] for a in prober.full}
        # the CPU workload on meta first: does it run, and what does it compute (FLOPs)
        result: dict[str, Any] | None
        try:
            flops = an._run(consts, count_flops=True).flops
            result = None
        except ProbeFailure as f:
            flops, result = None, {"ok": False, "phase": f.phase, "reason": f.reason}
        shrinking_pays = prev_flops is None or flops is None or flops < prev_flops / 2
        prev_flops = flops
        if flops is not None and flops > CPU_FLOP_BUDGET and budget > MIN_ELEMENT_BUDGET and shrinking_pays:
            # (not when the last lowering did not halve the FLOPs: fixed-size weights dominate)
            steps = max(1, math.ceil(math.log2(flops / CPU_FLOP_BUDGET)))
            lower = max(MIN_ELEMENT_BUDGET, budget >> steps)
            d.kernelarc.cpu_element_budget = lower
            if cpu_workloads(d, problem.workloads)[0].axes != cpu.axes:
                budget = lower
                continue
        if result is None:
            if flops is not None and flops > CPU_FLOP_HARD_CAP:
                result = {
                    "ok": False,
                    "phase": "compute",
                    "reason": f"one call takes {flops / 1e9:.1f} GFLOP, too much to run here",
                }
            else:
                result = verify_on_cpu(path, problem, axes)
        attempts.append({"axes": cpu.axes, "flops": flops, **result})
        if result["ok"] or result["phase"] in ("size", "compute"):
            break
        if result["phase"] == "shapes":
            if an.joint:  # two sizes equal by coincidence fooled the joint run
                an.redo_per_axis()
                sym = an.symbols()
                continue
            break
        # an axis whose shrinking alone makes the model fail gets a lower bound (the
        # smallest size of its halving chain that runs) or stays at its size
        shrunk = [a for a in sorted(an.var) if cpu.axes.get(a) != prober.full[a] and a not in reduced]
        suspects = [a for a in shrunk if cpu.axes[a] < an.known_ok.get(a, prober.full[a])]
        culprits = []
        for a in sorted(suspects, key=lambda a: cpu.axes[a] / an.known_ok.get(a, prober.full[a])):
            try:
                an._run(an._at({a: cpu.axes[a]}))
            except ProbeFailure:
                culprits.append(a)
        if not culprits:
            # only the combination fails (batch norm at batch 1 on 1x1 maps): the most shrunk
            # axis that, at twice its size, lets the workload run gets that as a lower bound
            for a in sorted(shrunk, key=lambda a: cpu.axes[a] / prober.full[a]):
                trial = {**consts, a: min(prober.full[a], 2 * cpu.axes[a])}
                trial.update({f: trial[l] for f, l in an.tied.items() if l == a})
                try:
                    an._run(trial, count_flops=True)  # the next round's count, if it is chosen
                except ProbeFailure:
                    continue
                an.lower[a] = trial[a]
                break
            else:
                break
            sym = an.symbols()
            continue
        for a in culprits:
            least = smallest_working(an, a, cpu.axes[a])
            if least is None:
                an.var.discard(a)
                an.fixed[a] = f"the reference fails on the CPU when it is {cpu.axes[a]}"
            else:
                an.lower[a] = least
        sym = an.symbols()
    t_verify = time.perf_counter()
    spec = an.spec(sym, budget)
    spec["cpu_check"] = attempts[-1] if attempts else {"ok": False, "phase": "?", "reason": "not run"}
    spec["cpu_attempts"] = len(attempts)
    spec["mode"] = an.mode
    spec["notes"] = an.notes
    spec["runs"] = prober.runs
    spec["timings"] = {
        "base_s": t_base - t0,
        "axes_s": t_deps - t_base,
        "cpu_check_s": t_verify - t_deps,
        "total_s": time.perf_counter() - t0,
    }
    return spec
