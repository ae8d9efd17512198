"""Run by the KernelBench importer in a subprocess: find a file's interface without running it
at full size. Needs torch; never imported by the server.

``python -m guard.problems.kernelbench_probe`` reads one JSON request per line on stdin
(``{"path": ...}``) and answers one JSON line per request on stdout. torch is imported once;
each file is probed in a forked child with an address-space limit and a time limit, so one
file's memory, crash or global changes never reach the next.

How a file is probed:

1. Shapes and dtypes at the full KernelBench size come from torch's meta device: the inputs,
   the model (its parameters and buffers) and the forward run under ``torch.device("meta")``,
   so nothing is allocated or computed. Where the model cannot be built on meta (its
   constructor calls ``.item()``), it is built on the CPU and moved to meta. Where the forward
   cannot run on meta (``.item()``, data-dependent shapes, ops without meta kernels), a
   reduced-size probe runs the model for real on the CPU with the size constants shrunk.
2. Each size constant is halved in turn (what the CPU derivation does): the dims that follow
   it become that axis; dims that follow it through arithmetic (convolution and pooling
   outputs) become expression axes fitted on a few more sizes; a constant whose halving
   breaks the model or changes its structure (layer counts, kernel sizes) stays fixed.
3. The CPU workload is derived as for every problem (``derive.cpu_workloads``) and the
   generated reference is run once, for real, on the CPU at that workload, through the same
   ``generate_inputs``/``run`` the guard calls. A constant whose shrinking makes that run fail
   is fixed and the workload derived again.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import resource
import select
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .kernelbench_consts import module_constants
from .model_state import untied_state
from .kernelbench_import import (
    CPU_RUN_LIMIT_S,
    META_RUN_LIMIT_S,
    build_problem,
    axes_adapter_source,
)

if TYPE_CHECKING:
    from .problem import Problem

# a forward argument (name, "tensor" or "scalar", shape or None, dtype, a scalar's value), a
# state_dict entry (key, shape, dtype) and an output ("tensor", shape, dtype)
ArgEntry = tuple[str, str, tuple[int, ...] | None, str, bool | int | float | None]
StateEntry = tuple[str, tuple[int, ...], str]
OutputEntry = tuple[str, tuple[int, ...] | None, str]
# names, kinds, ranks and dtypes (``Iface.structure``, ``Prober._structure``)
Structure = tuple[tuple[object, ...], ...]
# one dim of the interface: ("args" | "state" | "outputs", index, dim)
DimKey = tuple[str, int, int]
# what a dim is: a size, an axis, ("fit", axis) or ("expr", expression) over one axis, or
# ("multi", axes) when several axes move it
Symbol = int | str | tuple[Literal["fit", "expr"], str] | tuple[Literal["multi"], tuple[str, ...]]

# --------------------------------------------------------------------------- helpers


class _Timeout(BaseException):
    """Raised by the interval timer; a BaseException so that user code's ``except Exception``
    cannot swallow it."""


class ProbeFailure(Exception):
    def __init__(self, phase: str, reason: str, exc: BaseException | None = None):
        super().__init__(f"{phase}: {reason}")
        self.phase = phase
        self.reason = reason
        self.exc = exc


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def _fire(signum: int, frame: object) -> None:
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _where(exc: BaseException, path: str) -> str:
    """The deepest line of the problem file in the exception's traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if not frames:
        return ""
    f = frames[-1]
    code = (f.line or "").strip()
    return f"line {f.lineno} in {f.name}" + (f": `{code}`" if code else "")


def _construct(exc: BaseException, where: str) -> str:
    """What the meta device could not do, in words."""
    msg = str(exc)
    code = where.split("`")[1] if "`" in where else ""
    if "item() cannot be called on meta" in msg or "_local_scalar_dense" in msg:
        if code.startswith(("if ", "while ", "elif ", "assert ")):
            return "branches on a tensor's value, which the meta device cannot evaluate"
        return "calls .item() on a tensor (reads a value), which the meta device cannot evaluate"
    if "data-dependent" in msg.lower() or "nonzero" in msg:
        return "has an output shape that depends on tensor values, which the meta device cannot evaluate"
    if "meta" in msg.lower() and ("Could not run" in msg or isinstance(exc, NotImplementedError)):
        op = msg.split("'")[1] if "'" in msg else "an operator"
        return f"uses {op}, which has no meta kernel"
    return "fails on the meta device"


def _reason(exc: BaseException, path: str, limit: float | None = None) -> str:
    where = _where(exc, path)
    if isinstance(exc, _Timeout):
        text = f"took over {limit:g} s" if limit else "ran out of time"
    elif isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or ("DefaultCPUAllocator" in str(exc)):
        text = f"ran out of memory (the probe allows {_mem_cap_gib():g} GiB)"
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        text = f"{type(exc).__name__}: {first[:300]}"
    return f"{where}: {text}" if where else text


def _mem_cap_gib() -> float:
    return float(os.environ.get("KERNELARC_PROBE_MEM_GIB", "4"))


# ------------------------------------------------------------------ the RNN shortcut


def _patch_for_meta(torch: Any) -> None:
    """Shape-only shortcuts on meta tensors for what torch's meta device runs slowly in
    Python: the LSTM/GRU recurrence step by step (about 30 s for a 6-layer LSTM over 512
    steps) and the normalizations."""
    vf = torch._VF
    if getattr(vf, "_kernelarc_meta_rnns", False):
        return
    vf._kernelarc_meta_rnns = True

    def wrap(name: str, has_cell: bool) -> Callable[..., Any]:
        real = getattr(vf, name)

        def fn(*args: Any) -> Any:
            inp = args[0]
            if (
                len(args) == 9
                and isinstance(inp, torch.Tensor)
                and inp.device.type == "meta"
                and isinstance(args[2], (list, tuple))
            ):
                hx = args[1][0] if has_cell else args[1]
                d = 2 if args[7] else 1
                out = inp.new_empty(tuple(inp.shape[:-1]) + (d * hx.shape[-1],))
                # the matmuls the recurrence does (input, hidden and projection weights), so
                # that a FLOP counter sees them; shapes only, on meta
                rows = inp.numel() // max(1, inp.shape[-1])
                for w in args[2]:
                    if w.dim() == 2:
                        torch.mm(w.new_empty((rows, w.shape[1])), w.t())
                if has_cell:
                    return out, args[1][0].new_empty(args[1][0].shape), args[1][1].new_empty(args[1][1].shape)
                return out, hx.new_empty(hx.shape)
            return real(*args)

        return fn

    for name, cell in (("lstm", True), ("gru", False), ("rnn_tanh", False), ("rnn_relu", False)):
        try:
            setattr(vf, name, wrap(name, cell))
        except AttributeError:
            pass
    _patch_norms_for_meta(torch)


def _patch_norms_for_meta(torch: Any) -> None:
    """Batch, group, layer and instance norm on meta run torch's Python decompositions
    (three quarters of a DenseNet's meta forward); their output is shaped as the input.
    The checks that can fail for real are kept (F.batch_norm's batch-size check runs
    before ``torch.batch_norm``; the others are repeated here)."""

    def meta(x: object) -> bool:
        return isinstance(x, torch.Tensor) and x.device.type == "meta"

    real_bn, real_in, real_gn, real_ln = (torch.batch_norm, torch.instance_norm, torch.group_norm, torch.layer_norm)

    def batch_norm(input: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.empty_like(input) if meta(input) else real_bn(input, *args, **kwargs)

    def instance_norm(input: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.empty_like(input) if meta(input) else real_in(input, *args, **kwargs)

    def group_norm(input: Any, num_groups: int, *args: Any, **kwargs: Any) -> Any:
        if meta(input):
            if input.dim() < 2 or input.shape[1] % num_groups:
                raise RuntimeError(
                    f"Expected number of channels in input to be divisible by num_groups, but got "
                    f"input of shape {list(input.shape)} and num_groups={num_groups}"
                )
            return torch.empty_like(input)
        return real_gn(input, num_groups, *args, **kwargs)

    def layer_norm(input: Any, normalized_shape: Any, *args: Any, **kwargs: Any) -> Any:
        if meta(input):
            n = len(normalized_shape)
            if tuple(input.shape[input.dim() - n :]) != tuple(normalized_shape) or n > input.dim():
                raise RuntimeError(
                    f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                    f"[*, {', '.join(str(x) for x in normalized_shape)}], but got input of size {list(input.shape)}"
                )
            return torch.empty_like(input)
        return real_ln(input, normalized_shape, *args, **kwargs)

    torch.batch_norm, torch.instance_norm = batch_norm, instance_norm
    torch.group_norm, torch.layer_norm = group_norm, layer_norm


# ----------------------------------------------------------------------- interface


class Iface:
    """Shapes and dtypes of a run: forward arguments, state_dict entries, outputs."""

    def __init__(self, args: list[ArgEntry], state: list[StateEntry], outputs: list[OutputEntry]):
        self.args = args  # [(name, kind, shape|None, dtype, value)]
        self.state = state  # [(key, shape, dtype)]
        self.outputs = outputs  # [(kind, shape|None, dtype)]
        self.flops: float | None = None  # of the forward, when counted
        self.has_outputs = True  # False: the forward was not run

    def structure(self) -> Structure:
        return (
            tuple((n, k, None if s is None else len(s), d) for n, k, s, d, _ in self.args),
            tuple((k, len(s), d) for k, s, d in self.state),
            tuple((k, None if s is None else len(s), d) for k, s, d in self.outputs),
        )

    def dims(self) -> dict[DimKey, int]:
        out: dict[DimKey, int] = {}
        for i, (_, kind, shape, _, _) in enumerate(self.args):
            for j, v in enumerate(shape or ()):
                out[("args", i, j)] = v
        for i, (_, shape, _) in enumerate(self.state):
            for j, v in enumerate(shape):
                out[("state", i, j)] = v
        for i, (_, shape, _) in enumerate(self.outputs):
            for j, v in enumerate(shape or ()):
                out[("outputs", i, j)] = v
        return out

    def largest(self) -> int:
        return max((math.prod(s) for s in self._shapes()), default=1)

    def _shapes(self) -> Iterator[tuple[int, ...]]:
        for _, kind, shape, _, _ in self.args:
            if shape is not None:
                yield shape
        for _, shape, _ in self.state:
            yield shape
        for _, shape, _ in self.outputs:
            if shape is not None:
                yield shape


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


class Prober:
    def __init__(self, path: str):
        import torch

        self.torch = torch
        _patch_for_meta(torch)
        self.path = path
        self.source = Path(path).read_text()
        self.consts = module_constants(self.source)
        self.full = self.consts.values
        self.code = compile(self.source, path, "exec")
        self.ns: dict[str, Any] = {"__name__": "kernelbench_problem", "__file__": path}
        try:
            with torch.device("meta"):
                exec(self.code, self.ns)
        except BaseException as exc:  # noqa: BLE001 - any failure of the file's own code
            hint = ""
            if isinstance(exc, ModuleNotFoundError):
                hint = f" (install {exc.name!r} in the guard's environment)"
            raise ProbeFailure("executing the file", _reason(exc, path) + hint, exc) from None
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in self.ns]
        if missing:
            raise ProbeFailure("executing the file", f"it defines no {', '.join(missing)}")
        exec(compile(axes_adapter_source(self.consts), "<kernelarc adapter>", "exec"), self.ns)
        self.param_names = self._forward_names()
        self.runs = 0

    def _structure(self, args: list[Any], state: dict[str, Any]) -> Structure:
        torch = self.torch
        names = self._names(len(args))
        a: list[tuple[str, str, int | None, str]] = []
        for n, v in zip(names, args):
            if isinstance(v, torch.Tensor):
                a.append((n, "tensor", v.dim(), _dtype(v)))
            else:
                a.append((n, "scalar", None, {bool: "bool", int: "int64", float: "float32"}.get(type(v), "?")))
        s = tuple((k, v.dim(), _dtype(v)) for k, v in state.items() if isinstance(v, torch.Tensor))
        return (tuple(a), s)

    def _names(self, n: int) -> list[str]:
        names = list(self.param_names[:n])
        return names + [f"arg{i}" for i in range(len(names), n)]

    def _forward_names(self) -> list[str]:
        try:
            sig = inspect.signature(self.ns["Model"].forward)
        except (TypeError, ValueError):
            return []
        params = list(sig.parameters.values())[1:]  # drop self
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    # -- one run -------------------------------------------------------------------------
    def interface(
        self,
        axes: dict[str, int],
        mode: str,
        limit: float,
        structure: Structure | None = None,
        forward: bool = True,
        count_flops: bool = False,
    ) -> Iface:
        """Run at ``axes``: "meta" (all on meta), "cpu-init" (model built on the CPU, then
        moved to meta) or "cpu" (all real, on the CPU). With ``structure``, a run whose
        arguments or state differ from it in names, ranks or dtypes stops before forward
        (ProbeFailure with phase "structure")."""
        torch, ns = self.torch, self.ns
        self.runs += 1
        meta = contextlib.nullcontext() if mode == "cpu" else torch.device("meta")
        phase = "setting the constants"
        try:
            with _time_limit(limit):
                ns["_ka_set_axes"](axes)
                torch.manual_seed(0)
                phase = "get_inputs()"
                with meta:
                    args = list(ns["get_inputs"]())
                phase = "get_init_inputs()"
                with meta:
                    init = list(ns["get_init_inputs"]())
                phase = "building the Model"
                if mode == "cpu-init":
                    model = ns["Model"](*init).to("meta")
                else:
                    with meta:
                        model = ns["Model"](*init)
                state = untied_state(model)
                if structure is not None:
                    seen = self._structure(args, state)
                    if seen != structure[:2]:
                        raise ProbeFailure("structure", "the forward arguments or the model's parameters change")
                flops = None
                if not forward:
                    out = []
                elif count_flops:
                    from torch.utils.flop_counter import FlopCounterMode

                    phase = "forward"
                    counter = FlopCounterMode(display=False)
                    with meta, torch.no_grad(), counter:
                        out = model(*args)
                    flops = counter.get_total_flops()
                else:
                    phase = "forward"
                    with meta, torch.no_grad():
                        out = model(*args)
        except ProbeFailure:
            raise
        except BaseException as exc:  # noqa: BLE001 - the file's own code, any failure
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ProbeFailure(phase, _reason(exc, self.path, limit), exc) from None
        names = self._names(len(args))
        a: list[ArgEntry] = []
        for n, v in zip(names, args):
            if isinstance(v, torch.Tensor):
                a.append((n, "tensor", tuple(v.shape), _dtype(v), None))
            elif isinstance(v, bool):
                a.append((n, "scalar", None, "bool", v))
            elif isinstance(v, int):
                a.append((n, "scalar", None, "int64", v))
            elif isinstance(v, float):
                a.append((n, "scalar", None, "float32", v))
            else:
                raise ProbeFailure("get_inputs()", f"argument {n} is a {type(v).__name__}, not a tensor or number")
        s: list[StateEntry] = [(k, tuple(v.shape), _dtype(v)) for k, v in state.items() if isinstance(v, torch.Tensor)]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        o: list[OutputEntry] = []
        for i, v in enumerate(outs):
            if not isinstance(v, torch.Tensor):
                raise ProbeFailure("forward", f"output {i} is a {type(v).__name__}, not a tensor")
            o.append(("tensor", tuple(v.shape), _dtype(v)))
        iface = Iface(a, s, o)
        iface.flops = flops
        iface.has_outputs = forward
        return iface


# ------------------------------------------------------------------------- analysis


def _fit(samples: list[tuple[int, int]], axis: str) -> str | None:
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
                    f"{_construct(meta_fail.exc, _where(meta_fail.exc, self.p.path))} "
                    f"({meta_fail.reason})"
                )
                return
            except ProbeFailure:
                pass
        construct = (
            _construct(meta_fail.exc, _where(meta_fail.exc, self.p.path))
            if meta_fail.exc is not None and not isinstance(meta_fail.exc, _Timeout)
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
            with _time_limit(META_RUN_LIMIT_S), torch.device("meta"):
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
        from .kernelbench_import import BATCH_AXIS_NAMES

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
                expr = _fit([(val, d[k]) for val, d in self.samples[a].items() if k in d], a)
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


# ------------------------------------------------------------------------ verification


CHECK_MAX_BYTES = 1 << 30  # a CPU workload whose tensors add up to more is not run
CPU_FLOP_BUDGET = 5e8  # FLOPs (matmuls, convolutions) of one reference call at the CPU workload
MIN_ELEMENT_BUDGET = 1 << 10  # the CPU element budget is never lowered below this
CPU_FLOP_HARD_CAP = 1e10  # a CPU workload computing more is not run at import
DETERMINISM_MAX_S = 1.0  # the reference runs a second time (same inputs) when this fast


def _verify(path: str, problem: Problem, axes: dict[str, int]) -> dict[str, Any]:
    """Run the generated reference once on the CPU at ``axes`` (resolved), as the guard
    would: ``generate_inputs`` then ``run``; compare the shapes with the definition's."""
    import torch

    d = problem.definition
    io_bytes = d.io_bytes(axes)
    if io_bytes > CHECK_MAX_BYTES:
        return {
            "ok": False,
            "phase": "size",
            "reason": f"its inputs and outputs take {io_bytes / (1 << 30):.1f} GiB, too much to run",
        }
    ns: dict[str, Any] = {"__name__": "kernelbench_reference", "__file__": path}
    t0 = time.perf_counter()
    phase = "loading the reference"
    try:
        with _time_limit(CPU_RUN_LIMIT_S):
            exec(compile(d.reference, path, "exec"), ns)
            phase = "generate_inputs"
            torch.manual_seed(0)
            inputs = ns["generate_inputs"](axes, "cpu")
            phase = "run"
            torch.manual_seed(1)
            out1 = ns["run"](**inputs)
            seconds = time.perf_counter() - t0
            out2 = None
            if seconds < DETERMINISM_MAX_S:
                torch.manual_seed(2)
                out2 = ns["run"](**inputs)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"ok": False, "phase": phase, "reason": _reason(exc, path, CPU_RUN_LIMIT_S)}
    outs1 = list(out1) if isinstance(out1, (tuple, list)) else [out1]
    predicted = [list(d.shape_of(s, axes)) for s in d.outputs.values()]
    got = [list(o.shape) if isinstance(o, torch.Tensor) else None for o in outs1]
    if got != predicted:
        return {"ok": False, "phase": "shapes", "reason": f"outputs {got}, the definition says {predicted}"}
    for n, s in d.inputs.items():
        v = inputs.get(n)
        want = list(d.shape_of(s, axes)) if s.shape is not None else None
        if isinstance(v, torch.Tensor) and list(v.shape) != want:
            return {
                "ok": False,
                "phase": "shapes",
                "reason": f"input {n} is {list(v.shape)}, the definition says {want}",
            }
    result: dict[str, Any] = {
        "ok": True,
        "seconds": seconds,
        "largest_elements": max(
            [v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)] + [o.numel() for o in outs1],
            default=0,
        ),
    }
    if out2 is not None:
        outs2 = list(out2) if isinstance(out2, (tuple, list)) else [out2]
        result["deterministic"] = all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(outs1, outs2))
    return result


def _smallest_working(an: "Analysis", a: str, failing: int) -> int | None:
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
    from .derive import CPU_ELEMENT_BUDGET, cpu_workloads

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
                result = _verify(path, problem, axes)
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
            least = _smallest_working(an, a, cpu.axes[a])
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


# ----------------------------------------------------------------------------- serving


def _child(path: str, opts: dict[str, Any], wfd: int) -> None:
    os.dup2(2, 1)  # the file's own prints must not reach the protocol stream
    warnings.simplefilter("ignore")
    import torch

    # one thread: the runs are small, and OpenMP threads spinning on a busy machine made a
    # 0.1 s forward take seconds
    torch.set_num_threads(1)
    cap = int(_mem_cap_gib() * (1 << 30))
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + cap, vm + cap))
    except (OSError, ValueError, StopIteration):
        pass
    try:
        reply: dict[str, Any] = {"ok": True, "spec": analyze(path, opts)}
    except ProbeFailure as f:
        reply = {"ok": False, "error": f"{f.phase}: {f.reason}" if f.phase != "probe" else f.reason}
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        reply = {
            "ok": False,
            "error": f"the probe failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}",
        }
    data = json.dumps(reply).encode()
    view = memoryview(data)
    while view:
        n = os.write(wfd, view)
        view = view[n:]
    os.close(wfd)
    os._exit(0)


def probe_in_child(path: str, opts: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Fork, probe ``path`` in the child, return its reply (or why it gave none)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            _child(path, opts, wfd)
        finally:
            os._exit(1)
    os.close(wfd)
    chunks: list[bytes] = []
    deadline, timed_out = time.monotonic() + timeout, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        poller = select.poll()  # not select.select: a server's descriptors may pass 1024
        poller.register(rfd, select.POLLIN)
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return {"ok": False, "error": f"probing the file took over {timeout:g} s"}
    if chunks:
        reply: dict[str, Any] = json.loads(b"".join(chunks))
        return reply
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name
        why = " (killed: out of memory, or by another process)" if sig == signal.SIGKILL else ""
        return {"ok": False, "error": f"the probe process died of {name}{why} before it could say why"}
    return {"ok": False, "error": f"the probe process exited with status {os.WEXITSTATUS(status)} and no reply"}


def _warm_up(torch: Any) -> None:
    """Load torch's lazily imported meta machinery once, before forking (meta only: no CPU
    kernel runs here, so no thread pool exists when the children fork)."""
    with torch.device("meta"), torch.no_grad():
        x = torch.randn(2, 3, 8, 8)
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.LazyLinear(5),
        )
        m(x).softmax(-1)
        torch.nn.LSTM(4, 4, batch_first=True)(torch.randn(2, 3, 4))


def serve() -> None:
    import torch  # noqa: F401 - imported once, before the children fork

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _warm_up(torch)
        except Exception:  # noqa: BLE001 - only a speed-up
            pass
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        t0 = time.perf_counter()
        reply = probe_in_child(req["path"], req.get("options") or {}, float(req.get("timeout", 120)))
        reply["seconds"] = time.perf_counter() - t0
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
