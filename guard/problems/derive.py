"""Workloads the guard derives when a problem gives none: CPU-sized and held-out ones.

Held-out workloads are drawn with a generator keyed by the workspace secret, so they are
stable within a workspace, differ between workspaces, and never appear in a problem file
that an agent could read.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import blobs, formulas
from .problem import Problem
from .schema import Definition, InputSpec, RandomInput, SafetensorsInput, Workload

# A CPU workload keeps its largest tensor under this many elements (var axes shrink to fit).
CPU_ELEMENT_BUDGET = 1 << 18
CPU_WORKLOAD_COUNT = 4


@dataclass(frozen=True)
class WorkloadSet:
    """The workloads one device class evaluates: visible (timed) and held-out (checked only)."""

    visible: list[Workload]
    heldout: list[Workload]


def visible_workloads(problem: Problem, device_class: str, cpu_count: int = CPU_WORKLOAD_COUNT) -> list[Workload]:
    """The visible workloads a guard on ``device_class`` ("cuda" or "cpu") judges, as the
    problem gives them (no secret needed); on the CPU at most ``cpu_count``
    (``GuardConfig.cpu_workloads``), the smallest."""
    d = problem.definition
    if device_class == "cpu":
        return list(d.kernelarc.cpu_workloads or cpu_workloads(d, problem.workloads, cpu_count))[:cpu_count]
    return list(problem.workloads)


def workload_set(
    problem: Problem, device_class: str, secret: bytes, cpu_count: int = CPU_WORKLOAD_COUNT
) -> WorkloadSet:
    """Visible and held-out workloads for ``device_class`` ("cuda" or "cpu") (``visible_workloads``)."""
    d = problem.definition
    visible = visible_workloads(problem, device_class, cpu_count)
    if problem.heldout and device_class != "cpu":
        heldout = problem.heldout
    else:
        heldout = heldout_workloads(d, visible, secret, device_class, problem.workloads)
    return WorkloadSet(_stored_where_present(problem, visible), _stored_where_present(problem, heldout))


def _stored_where_present(problem: Problem, workloads: Sequence[Workload]) -> list[Workload]:
    """``workloads`` with each stored (safetensors) input whose file is not in the problem's
    folder, or holds no tensor of its name, typed as what the guard then makes of it: random
    (held-out inputs are kept out of that folder: ``sol_import.copy_blobs``). The input maker fills such an
    input at random anyway; typed as stored, it would keep its set's values on every timed
    call (the refill redraws what is typed random), so work derived from it alone, kept by a
    kernel from one call to the next, would go unseen, and offsets made for indices of
    another count would not end at theirs (red team, session 22)."""
    root = problem.root

    def present(spec: SafetensorsInput) -> bool:
        if root is None or not (Path(root) / spec.path).is_file():
            return False
        try:
            return spec.tensor_key in blobs.tensor_keys(Path(root) / spec.path)
        except (OSError, blobs.BlobError):
            return False

    out = []
    for w in workloads:
        missing = [k for k, v in w.inputs.items() if isinstance(v, SafetensorsInput) and not present(v)]
        if missing:
            inputs = {k: RandomInput() if k in missing else v for k, v in w.inputs.items()}
            w = w.model_copy(update={"inputs": inputs})
        out.append(w)
    return out


# ------------------------------------------------------------------- constraints


def dependent_axes(d: Definition) -> dict[str, str]:
    """Var axes fixed by a constraint ``axis == expression-of-other-axes``."""
    deps: dict[str, str] = {}
    for c in d.constraints:
        if c.count("==") != 1:
            continue
        left, right = (s.strip() for s in c.split("=="))
        for target, expr in ((left, right), (right, left)):
            if target in d.var_axes:
                try:
                    used = formulas.names_in(expr)
                except formulas.FormulaError:
                    continue
                if used <= set(d.axes) and target not in used:
                    deps[target] = expr
                    break
    return deps


def apply_constraints(d: Definition, axes: dict[str, int]) -> dict[str, int]:
    out = dict(axes)
    deps = dependent_axes(d)
    for _ in range(len(deps) + 1):
        for target, expr in deps.items():
            try:
                full = d.resolve_axes({**out, target: out.get(target, 0)})
                out[target] = int(formulas.evaluate(expr, full))
            except (ValueError, KeyError):
                continue
    return out


# ------------------------------------------------------------------- CPU workloads


def largest_tensor(d: Definition, axes: dict[str, int]) -> int:
    full = d.resolve_axes(axes)
    sizes = [
        math.prod(d.shape_of(s, full))
        for s in list(d.inputs.values()) + list(d.outputs.values())
        if s.shape is not None
    ]
    return max(sizes, default=1)


def cpu_budget(d: Definition) -> int:
    """The largest tensor (elements) a derived CPU workload may have."""
    return d.kernelarc.cpu_element_budget or CPU_ELEMENT_BUDGET


def _axes_behind(d: Definition, name: str, deps: dict[str, str], seen: set[str] | None = None) -> set[str]:
    """The var axes a shape entry depends on, through expr axes and dependent axes."""
    seen = set() if seen is None else seen
    if name in seen or name not in d.axes:
        return set()
    seen.add(name)
    axis = d.axes[name]
    expr = getattr(axis, "expression", None) or deps.get(name)
    if expr is None:
        return {name} if name in d.var_axes else set()
    try:
        used = formulas.names_in(expr)
    except formulas.FormulaError:
        return set()
    out = {name} if name in d.var_axes else set()
    for n in used:
        out |= _axes_behind(d, n, deps, seen)
    return out


def _over_budget_axes(d: Definition, axes: dict[str, int], budget: int, deps: dict[str, str]) -> set[str] | None:
    """Var axes sizing a tensor over ``budget``; None when every tensor fits."""
    full = d.resolve_axes(axes)
    used: set[str] = set()
    over = False
    for s in list(d.inputs.values()) + list(d.outputs.values()):
        if s.shape is None or math.prod(d.shape_of(s, full)) <= budget:
            continue
        over = True
        for dim in s.shape:
            if isinstance(dim, str):
                used |= _axes_behind(d, dim, deps)
    return used if over else None


_LOWER_BOUND = re.compile(r"^\s*([A-Za-z_]\w*)\s*>=\s*(\d+)\s*$")


def lower_bounds(d: Definition) -> dict[str, int]:
    """Var axes with a constraint ``axis >= N`` (the smallest size the op works at)."""
    out: dict[str, int] = {}
    for c in d.constraints:
        m = _LOWER_BOUND.match(c)
        if m and m.group(1) in d.var_axes:
            out[m.group(1)] = max(out.get(m.group(1), 1), int(m.group(2)))
    return out


def shrink(d: Definition, axes: dict[str, int], budget: int = CPU_ELEMENT_BUDGET) -> dict[str, int]:
    """Halve the largest free var axis that sizes a tensor over the budget until every
    tensor fits (axes only fixed-size tensors exceed are left alone; no axis goes below a
    ``axis >= N`` constraint)."""
    out = dict(axes)
    deps = dependent_axes(d)
    free = [a for a in d.var_axes if a not in deps]
    floor = lower_bounds(d)
    for _ in range(64):
        out = apply_constraints(d, out)
        used = _over_budget_axes(d, out, budget, deps)
        if used is None:
            break
        shrinkable = [a for a in free if out.get(a, 1) > 1 and a in used and out[a] // 2 >= floor.get(a, 1)]
        if not shrinkable:
            break
        biggest = max(shrinkable, key=lambda a: out[a])
        out[biggest] = max(1, out[biggest] // 2)
    return apply_constraints(d, out)


def cpu_workloads(d: Definition, workloads: list[Workload], count: int = CPU_WORKLOAD_COUNT) -> list[Workload]:
    """Small versions of the visible workloads for machines without a GPU, ``count`` at most,
    the smallest first."""
    seen: set[tuple[tuple[str, int], ...]] = set()
    out: list[Workload] = []
    ordered = sorted(workloads, key=lambda w: largest_tensor(d, w.axes))
    for w in ordered:
        axes = shrink(d, w.axes, cpu_budget(d))
        key = tuple(sorted(axes.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(_resized(w, f"cpu-{w.uuid}", axes))
        if len(out) >= count:
            break
    if not out:  # a problem with no workloads at all: one with every var axis at 1
        axes = apply_constraints(d, {a: 1 for a in d.var_axes})
        out.append(Workload(uuid="cpu-0", axes=axes, inputs=_random_inputs(d)))
    return out


def _resized(w: Workload, uuid: str, axes: dict[str, int]) -> Workload:
    """A copy of ``w`` with new axes; stored tensors no longer fit, so they are synthesized."""
    inputs = dict(w.inputs)
    if axes != w.axes:
        inputs = {k: RandomInput() if isinstance(v, SafetensorsInput) else v for k, v in inputs.items()}
    return w.model_copy(update={"uuid": uuid[:128], "axes": axes, "inputs": inputs})


def _random_inputs(d: Definition) -> dict[str, InputSpec]:
    return {n: RandomInput() for n, s in d.inputs.items() if s.shape is not None}


# -------------------------------------------------------------- held-out workloads


def _rng(secret: bytes, d: Definition, device_class: str) -> random.Random:
    key = hmac.new(secret, f"heldout|{d.content_hash()}|{device_class}".encode(), hashlib.sha256)
    return random.Random(key.digest())


def _odd_non_pow2(rng: random.Random, lo: int, hi: int, avoid: set[int]) -> int:
    """An odd, non-power-of-two value in [lo, hi] not in ``avoid`` when one exists."""
    lo, hi = max(1, lo), max(1, hi)
    for _ in range(64):
        v = rng.randint(lo, hi) | 1
        if v > hi:
            v -= 2
        if v >= lo and v not in avoid and v & (v - 1) != 0:
            return v
    return rng.randint(lo, hi)


# A CPU held-out call costs at most this many times the costliest visible call: past the
# sizes shown, but not so far that a quadratic op's held-out rounds outweigh the whole verdict.
HELDOUT_COST_FACTOR = 4


def _cost(d: Definition, axes: dict[str, int]) -> float:
    """A call's cost: the definition's flops formula where it has one, else its largest tensor."""
    flops = d.flops(d.resolve_axes(axes))
    return flops if flops is not None else float(largest_tensor(d, axes))


@dataclass(frozen=True)
class _CpuRoom:
    """How far a CPU held-out workload may go, worked out once per problem: up to the problem's
    own largest value of each axis (``tops``), no tensor an axis sizes over the CPU's element
    budget, and a cost of at most ``HELDOUT_COST_FACTOR`` times the costliest visible call."""

    d: Definition
    tops: dict[str, int]
    budget: int
    deps: dict[str, str]
    limit: float

    @classmethod
    def of(cls, d: Definition, visible: list[Workload], full: Sequence[Workload]) -> "_CpuRoom":
        tops = {a: max((w.axes.get(a, 0) for w in full), default=0) for a in d.var_axes}
        limit = HELDOUT_COST_FACTOR * max(_cost(d, w.axes) for w in visible)
        return cls(d, tops, cpu_budget(d), dependent_axes(d), limit)

    def ceiling(self, base: dict[str, int], axis: str, shown: int) -> int:
        """The largest value of ``axis`` with the other axes as in ``base``; ``shown`` (the
        largest visible value) where nothing larger qualifies."""
        lo, hi = shown, self.tops.get(axis, 0)  # by bisection: both limits grow with the value
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(base, axis, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _fits(self, base: dict[str, int], axis: str, value: int) -> bool:
        axes = apply_constraints(self.d, {**base, axis: value})
        over = _over_budget_axes(self.d, axes, self.budget, self.deps) or set()
        return axis not in over and _cost(self.d, axes) <= self.limit


def heldout_workloads(
    d: Definition, visible: list[Workload], secret: bytes, device_class: str, full: Sequence[Workload] = ()
) -> list[Workload]:
    """Other values of the var axes, odd and non-power-of-two.

    On a GPU they lie inside the visible range: the visible workloads are the problem's own.
    On the CPU the visible workloads are the problem's smallest (shrunk to a budget), so a
    held-out value may lie anywhere up to ``_CpuRoom.ceiling`` (the problem's own largest, within
    the element budget and a few times the visible cost), and the first draws, one var axis
    each, lie above the largest visible value where there is room: a kernel that handles only
    the sizes it was shown (one tile and no loop over tiles, a normalisation over the whole
    tensor that is right for one row) meets a larger one there. Drawn inside the visible range
    only, such kernels were PASSED and ACCEPTed on the CPU, and a problem whose CPU workloads
    all had one token got no held-out workload at all (red team, session 46).

    A draw whose axes are a visible workload's, or an earlier held-out one's, is dropped: it
    hides no shape, and at a real size it cost as much as the visible rounds (a KernelBench
    file has one shape, so on a GPU its three held-out workloads were that shape again: 36-42 s
    of six 6 GiB rounds on the H200). Up to four draws per workload are tried, so a problem
    with a single shape gets none on a GPU."""
    count = d.kernelarc.heldout_count
    if count == 0 or not visible:
        return []
    rng = _rng(secret, d, device_class)
    deps = dependent_axes(d)
    every = [a for a in d.var_axes if a not in deps]
    free = every
    if d.kernelarc.heldout_axes is not None:
        free = [a for a in every if a in d.kernelarc.heldout_axes]
    seen = {a: {w.axes.get(a, 0) for w in visible} for a in every}
    room = _CpuRoom.of(d, visible, full) if device_class == "cpu" else None
    taken = [w.axes for w in visible]
    out: list[Workload] = []
    if room is not None:
        fixed = [a for a in every if a not in free]
        out = _own_sizes_past_those_shown(room, visible, full, fixed, free, seen, taken)
    drawn = 0
    for attempt in range(4 * count):
        if drawn == count:
            break
        # the CPU's first draws go past what was shown, one axis each, the others as in a
        # visible workload that leaves room for it (two axes pushed together were shrunk back
        # inside the budget: review, session 46)
        beyond = free[attempt] if room is not None and attempt < len(free) else None
        base = rng.choice(visible)
        if room is not None and beyond is not None:
            shown = max(seen[beyond])
            roomy = [w for w in visible if room.ceiling(w.axes, beyond, shown) > shown]
            base = rng.choice(roomy) if roomy else base
        axes = dict(base.axes)
        for a in free if beyond is None else [beyond]:
            lo, hi = min(seen[a]), max(seen[a])
            top = room.ceiling(base.axes, a, hi) if room is not None else hi
            if beyond is not None:
                if top > hi:
                    axes[a] = _odd_non_pow2(rng, max(hi + 1, top // 2 + 1), top, seen[a])
                continue
            if top <= 1:
                continue
            axes[a] = _odd_non_pow2(rng, max(1, lo), top, seen[a])
        axes = apply_constraints(d, axes)
        if device_class == "cpu":
            axes = shrink(d, axes, cpu_budget(d))
        if axes in taken:
            continue
        taken.append(axes)
        out.append(_resized(base, f"heldout-{device_class}-{len(out)}", axes))
        drawn += 1
    return out


def _own_sizes_past_those_shown(
    room: _CpuRoom,
    visible: list[Workload],
    full: Sequence[Workload],
    fixed: list[str],
    free: list[str],
    seen: dict[str, set[int]],
    taken: list[dict[str, int]],
) -> list[Workload]:
    """On the CPU, for each var axis that held-out draws do not vary (``heldout_axes``: a
    model's vocabulary, heads or K, on which a kernel may rely on the problem's own values):
    one workload at the largest of the problem's own values of it above the largest the CPU
    showed that fits, with the axes held-out draws vary at their smallest (one token, say),
    where that makes the most room. A kernel that caps such an axis at what the CPU showed (a
    softmax over the first 131,072 columns, a matmul without a loop over K) was PASSED and
    ACCEPTed while these axes took visible values only (second red team, session 46)."""
    d = room.d
    out: list[Workload] = []
    floor = lower_bounds(d)
    base = min(visible, key=lambda w: _cost(d, w.axes))
    smallest = apply_constraints(d, {**base.axes, **{f: floor.get(f, 1) for f in free}})
    for a in fixed:
        shown = max(seen[a])
        ceiling = room.ceiling(smallest, a, shown)
        fitting = [v for v in {w.axes.get(a, 0) for w in full} if shown < v <= ceiling]
        if not fitting:
            continue
        axes = apply_constraints(d, {**smallest, a: max(fitting)})
        if axes in taken:
            continue
        taken.append(axes)
        out.append(_resized(base, f"heldout-cpu-own-{a}", axes))
    return out
