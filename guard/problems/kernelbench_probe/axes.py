"""Which constants of a file are axes, which dims follow them and through what formula, and
the spec the importer builds the problem from."""

from __future__ import annotations

import math
from typing import Any

from ..kernelbench_import import BATCH_AXIS_NAMES, CPU_RUN_LIMIT_S, META_RUN_LIMIT_S
from .failures import ProbeFailure, ProbeTimeout, meta_limitation, time_limit, where_in_file
from .interface import DimKey, Iface, Prober, Structure, Symbol


def fit_expression(samples: list[tuple[int, int]], axis: str) -> str | None:
    """``y = (p*v + q) // r`` through every (v, y) sample (convolution, pooling, transposed
    convolution and upsampling sizes, and chains of them)."""
    if len({v for v, _ in samples}) < 3:
        return None
    for r in range(1, 17):
        for p in range(1, 17):
            lo = max(r * y - p * v for v, y in samples)
            hi = min(r * y + r - 1 - p * v for v, y in samples)
            if lo <= hi:
                q = 0 if lo <= 0 <= hi else (lo if abs(lo) <= abs(hi) else hi)
                num = axis if p == 1 else f"{p} * {axis}"
                if q:
                    num += f" + {q}" if q > 0 else f" - {-q}"
                return num if r == 1 else f"({num}) // {r}"
    return None


class Analysis:
    def __init__(self, prober: Prober, opts: dict[str, Any]):
        self.known_ok: dict[str, int] = {}
        self.memo: dict[tuple[object, ...], Iface | ProbeFailure] = {}  # runs by axes: the repair loop repeats some
        self.p = prober
        self.opts = opts
        self.notes: list[str] = []

    def _run(
        self,
        axes: dict[str, int],
        limit: float | None = None,
        structure: Structure | None = None,
        forward: bool = True,
        count_flops: bool = False,
    ) -> Iface:
        limit = limit or (CPU_RUN_LIMIT_S if self.mode == "cpu" else META_RUN_LIMIT_S)
        key = (tuple(sorted(axes.items())), forward, structure is not None)
        hit = self.memo.get(key)
        if hit is not None and (
            isinstance(hit, ProbeFailure) or not count_flops or getattr(hit, "flops", None) is not None
        ):
            if isinstance(hit, ProbeFailure):
                raise hit
            return hit
        try:
            iface = self.p.interface(axes, self.mode, limit, structure, forward, count_flops)
        except ProbeFailure as f:
            self.memo[key] = f
            raise
        self.memo[key] = iface
        if forward and (structure is None or iface.structure() == structure):
            # the smallest size each constant is known to work at (others no larger than
            # their base size)
            ok = self.known_ok
            for a, v in axes.items():
                if a in self.base_axes and v < ok.get(a, self.base_axes[a]):
                    ok[a] = v
        return iface

    def _at(self, changes: dict[str, int]) -> dict[str, int]:
        """The base axes with ``changes``; a tied constant moves with its leader."""
        out = {**self.base_axes, **changes}
        for follower, leader in getattr(self, "tied", {}).items():
            if leader in changes:
                out[follower] = changes[leader]
        return out

    # -- step 1: a base point whose interface is known ------------------------------------
    def base(self) -> None:
        full = self.p.full
        try:
            self.mode, self.base_axes, self.iface = "meta", full, self.p.interface(full, "meta", META_RUN_LIMIT_S)
            return
        except ProbeFailure as f:
            meta_fail = f
        if meta_fail.phase == "building the Model" and meta_fail.exc is not None:
            try:
                self.mode = "cpu-init"
                self.base_axes, self.iface = full, self.p.interface(full, "cpu-init", CPU_RUN_LIMIT_S)
                self.notes.append(
                    f"the Model is built on the CPU and run on the meta device: its constructor "
                    f"{meta_limitation(meta_fail.exc, where_in_file(meta_fail.exc, self.p.path))} "
                    f"({meta_fail.reason})"
                )
                return
            except ProbeFailure:
                pass
        construct = (
            meta_limitation(meta_fail.exc, where_in_file(meta_fail.exc, self.p.path))
            if meta_fail.exc is not None and not isinstance(meta_fail.exc, ProbeTimeout)
            else "fails on the meta device"
        )
        what = f"{meta_fail.phase} {construct} ({meta_fail.reason})"
        self.mode = "cpu"
        tried = []
        for axes in self._reduced_candidates(meta_fail):
            try:
                self.iface = self.p.interface(axes, "cpu", CPU_RUN_LIMIT_S)
                self.base_axes = axes
                shrunk = {a: v for a, v in axes.items() if v != full[a]}
                self.notes.append(
                    f"{what}; shapes come from a run on the CPU at reduced size "
                    f"({', '.join(f'{a}={v}' for a, v in shrunk.items()) or 'full size'}) and are "
                    "extrapolated to the full size"
                )
                self.reduced = set(shrunk)
                return
            except ProbeFailure as f:
                tried.append(f"{f.phase}: {f.reason}")
        detail = tried[-1] if tried else "no reduced size to try"
        raise ProbeFailure("probe", f"{what}; the reduced-size probe failed with: {detail}")

    def _reduced_candidates(self, meta_fail: ProbeFailure) -> list[dict[str, int]]:
        """Reduced sizes to try on the CPU: the input-size constants halved until the inputs
        are small (when get_inputs runs on meta), the batch at 2, every constant over 16 / 8."""
        full = self.p.full
        seen: list[dict[str, int]] = []

        def add(axes: dict[str, int]) -> None:
            if axes not in seen and axes != full:
                seen.append(axes)

        shapes: list[tuple[int, ...]] = []
        try:  # get_inputs alone on meta: which constants size the inputs
            torch = self.p.torch
            self.p.ns["_ka_set_axes"](full)
            with time_limit(META_RUN_LIMIT_S), torch.device("meta"):
                shapes = [tuple(v.shape) for v in self.p.ns["get_inputs"]() if isinstance(v, torch.Tensor)]
        except BaseException:  # noqa: BLE001
            shapes = []
        values = full
        if shapes:
            axes = dict(full)
            for _ in range(64):
                cur = [self._shape_at(s, full, axes) for s in shapes]
                if max(math.prod(s) for s in cur) <= (1 << 18):
                    break
                used = {a for s in shapes for d in s for a in values if values[a] == d and axes[a] > 1}
                if not used:
                    break
                big = max(used, key=lambda a: axes[a])
                axes[big] = max(1, axes[big] // 2)
            add(axes)

        batch = [a for a in BATCH_AXIS_NAMES if a in full]
        if batch:
            add({**full, batch[0]: min(2, full[batch[0]])})
        add({a: (max(1, v // 8) if v >= 16 else v) for a, v in full.items()})
        return seen

    @staticmethod
    def _shape_at(shape: tuple[int, ...], full: dict[str, int], axes: dict[str, int]) -> list[int]:
        """A full-size shape with each dim that equals a constant's value scaled with it."""
        out = []
        for d in shape:
            match = [a for a in full if full[a] == d]
            out.append(axes[match[0]] if len(match) == 1 else d)
        return out

    # -- step 2: which constants are axes, and which dims follow them ------------------------
    def dependencies(self) -> None:
        """Which constants the interface follows. Each candidate (a constant whose value is
        some dim) is halved alone with the model only built (cheap): that finds structural
        constants, ties and the dims of the arguments and parameters. One forward run with
        every remaining candidate shrunk then attributes the output dims; where it fails or
        an output dim follows no single constant, each candidate is run alone."""
        B, I = self.base_axes, self.iface
        dims = I.dims()
        values = set(dims.values())
        self.structure = I.structure()
        self.var: set[str] = set()
        self.fixed: dict[str, str] = {}
        self.tied: dict[str, str] = {}  # follower -> leader: equal constants that must stay equal
        self.follow: dict[DimKey, set[str]] = {k: set() for k in dims}
        self.samples: dict[str, dict[int, dict[DimKey, int]]] = {}
        self.lower: dict[str, int] = {}
        cands = [a for a, v in B.items() if v >= 2 and v in values]
        kept = self._per_axis(cands, forward=False)
        self.joint = self._joint(kept)
        if not self.joint:
            self._per_axis(kept, forward=True)
        self._settle_ties()

    def redo_per_axis(self) -> None:
        """Attribute every dim from one run per constant (after the joint run was fooled by
        two sizes that are equal by coincidence)."""
        keep_fixed = {a: why for a, why in self.fixed.items() if "fails on the CPU" in why}
        lower = self.lower
        self.dependencies_per_axis()
        self.fixed.update(keep_fixed)
        for a in keep_fixed:
            self.var.discard(a)
        self.lower = lower

    def dependencies_per_axis(self) -> None:
        B, I = self.base_axes, self.iface
        dims = I.dims()
        values = set(dims.values())
        self.var, self.fixed, self.tied = set(), {}, {}
        self.follow = {k: set() for k in dims}
        self.samples = {}
        self.joint = False
        self._per_axis([a for a, v in B.items() if v >= 2 and v in values], forward=True)
        self._settle_ties()

    def _settle_ties(self) -> None:
        for follower, leader in self.tied.items():  # a tied constant is its leader
            self.var.discard(follower)
            self.fixed.pop(follower, None)
            for deps in self.follow.values():
                if follower in deps:
                    deps.discard(follower)
                    deps.add(leader)
        for a in getattr(self, "reduced", set()):
            if a not in self.tied:
                self.var.add(a)  # shrunk for the probe: must stay an axis
                self.fixed.pop(a, None)

    def _per_axis(self, cands: list[str], forward: bool) -> list[str]:
        """Halve each candidate alone; returns those that kept the structure."""
        B, dims = self.base_axes, self.iface.dims()
        kept = []
        for a in cands:
            if a in self.tied or a in self.fixed:
                continue
            v = B[a]
            group = [a]
            axes = self._at({a: v // 2})
            try:
                Ia = self._run(axes, structure=self.structure, forward=forward)
            except ProbeFailure as f:
                if f.phase == "structure":
                    self.fixed[a] = "halving it changes the model's structure"
                    self.var.discard(a)
                    continue
                # equal constants that must stay equal (a loss's inputs of equal sizes)
                peers = [
                    b for b in B if b != a and B[b] == v and b not in self.tied and b not in self.fixed and b in cands
                ]
                retry: Iface | None = None
                if peers:
                    axes = {**B, **{b: v // 2 for b in [a] + peers}}
                    try:
                        retry = self._run(axes, structure=self.structure, forward=forward)
                        group = [a] + peers
                    except ProbeFailure:
                        retry = None
                if retry is None:
                    self.fixed[a] = f"halving it fails ({f.phase}: {f.reason})"
                    self.var.discard(a)
                    continue
                Ia = retry
            if forward and Ia.structure() != self.structure:
                self.fixed[a] = "halving it changes the model's structure"
                self.var.discard(a)
                continue
            for b in group[1:]:
                self.tied[b] = a
            kept.append(a)
            da = Ia.dims()
            for k, val in da.items():
                if val != dims[k]:
                    self.follow[k].add(a)
                    self.var.add(a)
            self.samples.setdefault(a, {})[B[a]] = dims
            if forward or axes[a] not in self.samples[a]:
                self.samples[a][axes[a]] = da
        return kept

    def _joint(self, cands: list[str]) -> bool:
        """One forward run with every candidate shrunk (equal-valued ones to different
        sizes); False when it fails or an output dim cannot be attributed."""
        B, dims = self.base_axes, self.iface.dims()
        cands = [a for a in cands if a not in self.tied]
        if not cands:
            return True
        new: dict[str, int] = {}
        by_value: dict[int, int] = {}
        for a in cands:
            n = by_value.get(B[a], 0) + 1
            by_value[B[a]] = n
            new[a] = B[a] >> n
            if new[a] < 1:
                return False
        try:
            J = self._run(self._at(new), structure=self.structure)
        except ProbeFailure:
            return False
        if J.structure() != self.structure:
            return False
        dj = J.dims()
        outputs = [k for k in dims if k[0] == "outputs"]
        for k in outputs:
            if dj[k] == dims[k]:
                continue
            match = [a for a in cands if B[a] == dims[k] and new[a] == dj[k]]
            if len(match) != 1:
                return False  # a derived output dim: each candidate alone
            self.follow[k].add(match[0])
            self.var.add(match[0])
        for a in cands:
            self.samples.setdefault(a, {})[B[a]] = dims
        return True

    def symbols(self) -> dict[DimKey, Symbol]:
        """Each dim as a literal, an axis, or an expression over one axis."""
        B, dims = self.base_axes, self.iface.dims()
        out: dict[DimKey, Symbol] = {}
        self.exprs: dict[str, str] = {}
        unfitted: dict[str, str] = {}  # axis -> why it cannot vary
        for k, v in dims.items():
            deps = self.follow[k] & self.var
            if not deps:
                out[k] = v
                continue
            if len(deps) == 1:
                (a,) = deps
                s = self.samples.get(a, {})
                if v == B[a] and all(d.get(k, val) == val for val, d in s.items()):
                    out[k] = a
                    continue
                out[k] = ("fit", a)
            else:
                out[k] = ("multi", tuple(sorted(deps)))
        # expressions: a few more sizes of each axis with derived dims
        need: dict[str, bool] = {}  # axis -> whether an output dim needs the fit (forward runs)
        for k, x in out.items():
            if isinstance(x, tuple) and x[0] == "fit":
                need[x[1]] = need.get(x[1], False) or k[0] == "outputs"
        for a in sorted(need):
            self._sample_more(a, forward=need[a])
        for k, x in list(out.items()):
            if not isinstance(x, tuple):
                continue
            if x[0] == "fit":
                a = x[1]
                expr = fit_expression([(val, d[k]) for val, d in self.samples[a].items() if k in d], a)
                if expr is None:
                    unfitted.setdefault(a, "a size follows it through no simple formula")
                    continue
                if expr == a:
                    out[k] = a
                else:
                    out[k] = ("expr", expr)
            else:
                # a size set by several axes (an output size from the input size and the
                # kernel size): the largest stays an axis, the others are fixed
                keep = max(x[1], key=lambda a: (a in getattr(self, "reduced", set()), B[a]))
                for a in x[1]:
                    if a != keep:
                        unfitted.setdefault(a, f"a size follows it and {keep}; {keep} varies")
        if unfitted:
            # a dim that is no fitted function of one axis: those axes stay at their size
            for a, why in unfitted.items():
                if a in self.var and a not in getattr(self, "reduced", set()):
                    self.var.discard(a)
                    self.fixed[a] = why
            return self.symbols()
        return out

    def _sample_more(self, a: str, forward: bool = True) -> None:
        B = self.base_axes
        s = self.samples.setdefault(a, {})
        v = B[a]
        for val in (v // 4, v - 1, v // 2 + 1, v // 4 + 1, v // 8 + 1):
            if val < 1 or val in s or len(s) >= 6:
                continue
            try:
                I = self._run(self._at({a: val}), structure=self.structure, forward=forward)
            except ProbeFailure:
                continue
            if not forward or I.structure() == self.structure:
                s[val] = I.dims()

    # -- step 3: the spec the importer builds the problem from ---------------------------------
    def spec(self, sym: dict[DimKey, Symbol], budget: int | None = None) -> dict[str, Any]:
        full, I = self.p.full, self.iface
        names: dict[str, str] = {}
        exprs: dict[str, str] = {}
        taken = set(full)

        def shape_of(group: str, i: int, shape: tuple[int, ...] | None) -> list[str | int] | None:
            if shape is None:
                return None
            out: list[str | int] = []
            for j, _ in enumerate(shape):
                x = sym[(group, i, j)]
                if isinstance(x, tuple):  # ("expr", expression): the only pair symbols() leaves
                    expr = x[1]
                    assert isinstance(expr, str)
                    if expr not in names:
                        base = f"{label(group, i)}_d{j}"
                        while base in taken:
                            base += "_"
                        taken.add(base)
                        names[expr] = base
                        exprs[base] = expr
                    out.append(names[expr])
                else:
                    out.append(x)
            return out

        def label(group: str, i: int) -> str:
            if group == "args":
                return I.args[i][0]
            if group == "state":
                return I.state[i][0].replace(".", "__")
            return "output" if len(I.outputs) == 1 else f"output{i}"

        axes: dict[str, dict[str, object]] = {}
        for c in self.p.consts.constants:
            a = c.axis
            leader = self.tied.get(a)
            if leader is not None and leader in self.var:
                axes[a] = {"type": "expr", "expression": leader, "value": full[a]}
            else:
                axes[a] = {"type": "var" if a in self.var else "const", "value": full[a]}
        return {
            "axes": axes,
            "exprs": exprs,
            "args": [
                {"name": n, "kind": k, "shape": shape_of("args", i, s), "dtype": d}
                for i, (n, k, s, d, _) in enumerate(I.args)
            ],
            "state": [{"name": n, "shape": shape_of("state", i, s), "dtype": d} for i, (n, s, d) in enumerate(I.state)],
            "outputs": [
                {"kind": k, "shape": shape_of("outputs", i, s), "dtype": d} for i, (k, s, d) in enumerate(I.outputs)
            ],
            "fixed": dict(self.fixed),
            "tied": {f: l for f, l in self.tied.items() if l in self.var},
            "cpu_element_budget": budget,
            "lower": {a: v for a, v in self.lower.items() if a in self.var},
        }
