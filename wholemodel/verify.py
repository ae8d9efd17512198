"""Plugging kernels into a model and checking that it still works and got faster.

A kernel is a guard problem and a solution for it, built in this process by the guard's
builders. It serves a site call only where the call fits its problem: the site's family,
the problem's const axes and constants (an RMSNorm's hidden size and eps), and the input
dtype; other calls keep the model's own code and are counted as such, so a kernel that
serves nothing is reported, never silently ignored.

What is measured, with every kernel plugged in and (``diagnose``) with each alone:
  - the output's error against the model run in higher precision, next to the model's
    own error (see ``accuracy``);
  - whole-model speedup: median forward time of the original over the plugged model,
    the two measured in alternation so drift hits both alike;
  - per kernel, the time at the calls it serves, its code against the model's own
    (synchronized around each call, so absolute figures include that overhead).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from guard.builders import BuildError, get_builder
from guard.candidates.solution import Solution
from guard.paths import cache_dir
from guard.problems.problem import Problem
from guard.problems.schema import Definition
from guard.runner.common import normalize_outputs

from . import accuracy
from .loader import LoadedModel
from .sites import BY_FAMILY, Placement, placements, wrap_method

log = logging.getLogger(__name__)


@dataclass
class Kernel:
    name: str  # how tables name it: its problem
    problem: Problem
    run: Callable
    origin: str

    @property
    def family(self) -> str:
        d = self.problem.definition
        return d.kernelarc.op_family or ""

    def constants(self) -> dict[str, float]:
        source = self.problem.definition.kernelarc.source
        if "constants" in source:
            return dict(source["constants"])
        return dict(BY_FAMILY[self.family].template_constants) if self.family in BY_FAMILY else {}

    def serves(self, placement: Placement, args: tuple) -> bool:
        site = placement.site
        axes = site.axes(placement.module, args)
        if axes is None:
            return False
        d = self.problem.definition
        for name, spec in d.axes.items():
            if spec.type == "const" and axes.get(name) != spec.value:
                return False
        for name, value in site.constants(placement.module).items():
            if name in self.constants() and abs(self.constants()[name] - value) > 1e-12 * max(1.0, abs(value)):
                return False
        tensor_dtypes = [s.dtype for s in d.inputs.values() if s.shape is not None]
        return bool(tensor_dtypes) and str(args[0].dtype).removeprefix("torch.") == tensor_dtypes[0]


def use_triton_interpreter() -> None:
    """Triton kernels run on the CPU through Triton's interpreter, which must be chosen
    before triton is first imported in this process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        raise ValueError(
            "triton was imported before TRITON_INTERPRET=1 was set; Triton kernels cannot run on "
            "the CPU in this process (set TRITON_INTERPRET=1 in the environment)"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def build_kernel(problem: Problem, solution: Solution, origin: str, device: str, build_root: Path) -> Kernel:
    """Build a solution with the guard's builder for its language (CUDA needs a GPU here)."""
    family = problem.definition.kernelarc.op_family
    if family not in BY_FAMILY:
        raise ValueError(f"{problem.name}: no site for op family {family!r} (sites: {', '.join(BY_FAMILY)})")
    if device == "cpu":
        use_triton_interpreter()
    folder = Path(tempfile.mkdtemp(prefix=f"{problem.name[:40]}-", dir=build_root))
    src = folder / "src"
    src.mkdir()
    # the guard's content-addressed build cache: a seed already compiled by the guard is reused
    build = cache_dir() / "torch_extensions"
    build.mkdir(parents=True, exist_ok=True)
    try:
        fn = get_builder(solution.spec.primary_language).build(solution.model_dump(mode="json"), src, build, device)
    except BuildError as exc:
        raise ValueError(f"{problem.name} ({origin}) did not build: {exc}") from None
    return Kernel(
        problem.name, problem, _returning(problem.definition, fn, solution.spec.destination_passing_style), origin
    )


def _returning(d: Definition, fn: Callable, dps: bool) -> Callable:
    """The kernel as a function returning its one output, whatever its calling convention."""
    names = list(d.outputs)
    if len(names) != 1:
        raise ValueError(f"{d.name}: sites take one output, the problem has {len(names)}")

    def call(*args):
        if not dps:
            return normalize_outputs(fn(*args), names)[0]
        axes: dict[str, int] = {}
        for spec, t in zip(d.inputs.values(), args):
            for dim, size in zip(spec.shape or [], getattr(t, "shape", ())):
                if isinstance(dim, str):
                    axes[dim] = size
        axes = d.resolve_axes({a: axes[a] for a in d.var_axes})
        spec = d.outputs[names[0]]
        out = torch.empty(d.shape_of(spec, axes), dtype=getattr(torch, spec.dtype), device=args[0].device)
        fn(*args, out)
        return out

    return call


@dataclass
class KernelUse:
    served: int = 0  # calls per forward the kernel computed
    declined: int = 0  # calls of its family it could not serve (shape, dtype, constants)
    own_s: list[float] = field(default_factory=list)  # seconds per forward at its calls, model's code
    kernel_s: list[float] = field(default_factory=list)  # the same calls, kernel's code


class Plugged:
    """Context manager: the model with kernels plugged into its sites.

    ``active`` switches between the kernels and the model's own code without reinstalling;
    ``time_calls`` synchronizes around each served call and accumulates its time."""

    def __init__(self, lm: LoadedModel, kernels: list[Kernel]):
        self.lm, self.kernels = lm, kernels
        self.active = True
        self.time_calls = False
        self.use = {k.name: KernelUse() for k in kernels}
        self._seconds = {k.name: 0.0 for k in kernels}
        self._counting = {k.name: [0, 0] for k in kernels}  # [served, declined] in this forward
        self._undo: list = []

    def __enter__(self) -> Plugged:
        families = {k.family for k in self.kernels}
        for p in placements(self.lm.model):
            if p.site.family in families:
                self._undo.append(wrap_method(p.module, p.site.method, self._wrapper(p)))
        return self

    def __exit__(self, *exc) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _wrapper(self, p: Placement):
        mine = [k for k in self.kernels if k.family == p.site.family]
        sync = torch.cuda.synchronize if self.lm.device == "cuda" else (lambda: None)

        def wrapper(original, args, kwargs):
            kernel = None if kwargs else next((k for k in mine if k.serves(p, args)), None)
            if kernel is None:
                if self.active and mine:
                    self._counting[mine[0].name][1] += 1
                return original(*args, **kwargs)
            if self.active:
                self._counting[kernel.name][0] += 1
            if not self.time_calls:
                return p.site.call(p.module, kernel.run, args) if self.active else original(*args)
            sync()
            t0 = time.perf_counter()
            out = p.site.call(p.module, kernel.run, args) if self.active else original(*args)
            sync()
            self._seconds[kernel.name] += time.perf_counter() - t0
            return out

        return wrapper

    def forward(self, active: bool, time_calls: bool = False):
        """One forward, the kernels' (``active``) or the model's own; returns (output, seconds)."""
        self.active, self.time_calls = active, time_calls
        self._counting = {k.name: [0, 0] for k in self.kernels}
        self._seconds = {k.name: 0.0 for k in self.kernels}
        sync = torch.cuda.synchronize if self.lm.device == "cuda" else (lambda: None)
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            out = self.lm.model(*self.lm.inputs)
            sync()
            elapsed = time.perf_counter() - t0
        if active:
            for name, (served, declined) in self._counting.items():
                self.use[name].served, self.use[name].declined = served, declined
        if time_calls:
            for name, s in self._seconds.items():
                (self.use[name].kernel_s if active else self.use[name].own_s).append(s)
        return out, elapsed


@dataclass
class Trial:
    """One configuration of kernels: end-to-end check and whole-model timing."""

    kernels: list[str]
    check: accuracy.Check
    own_ms: float  # median forward, the model's code
    plugged_ms: float  # median forward, kernels plugged in
    use: dict[str, KernelUse]

    @property
    def speedup(self) -> float:
        return self.own_ms / self.plugged_ms if self.plugged_ms else float("nan")


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if hasattr(out, "logits"):
        return out.logits
    raise ValueError("the model's forward returns no tensor to compare (expected a tensor or a tuple)")


def trial(
    lm: LoadedModel,
    kernels: list[Kernel],
    own: torch.Tensor,
    ref_hi: torch.Tensor,
    reps: int,
    warmup: int,
    factor: float,
) -> Trial:
    with Plugged(lm, kernels) as plug:
        out, _ = plug.forward(active=True)
        check = accuracy.check(_first_tensor(out), own, ref_hi, lm.dtype, factor)
        for _ in range(warmup):
            plug.forward(active=True)
            plug.forward(active=False)
        own, plugged = [], []
        for _ in range(reps):  # alternate, so drift and clocks hit both alike
            plugged.append(plug.forward(active=True)[1])
            own.append(plug.forward(active=False)[1])
        for _ in range(max(3, reps // 2)):
            plug.forward(active=True, time_calls=True)
            plug.forward(active=False, time_calls=True)
    return Trial(
        [k.name for k in kernels], check, statistics.median(own) * 1e3, statistics.median(plugged) * 1e3, plug.use
    )


@dataclass
class Verification:
    model: str
    device: str
    dtype: str
    factor: float
    reps: int
    total: Trial
    alone: list[Trial] = field(default_factory=list)  # diagnose mode: each kernel alone
    origins: dict[str, str] = field(default_factory=dict)  # kernel name -> where its code came from

    @property
    def ok(self) -> bool:
        return self.total.check.ok and all(u.served > 0 for u in self.total.use.values())

    def to_json(self) -> dict:
        """What ``--json`` prints, and what a sandboxed verification sends back (read there by
        ``wholemodel.job.VerificationResult``)."""

        def trial(t: Trial) -> dict:
            return {
                "kernels": t.kernels,
                "check": dataclasses.asdict(t.check),
                "model_ms": t.own_ms,
                "plugged_ms": t.plugged_ms,
                "speedup": t.speedup,
                "use": {n: dataclasses.asdict(u) for n, u in t.use.items()},
            }

        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "error_factor": self.factor,
            "reps": self.reps,
            "ok": self.ok,
            "origins": self.origins,
            "total": trial(self.total),
            "alone": [trial(t) for t in self.alone],
        }


def verify(
    lm: LoadedModel,
    kernels: list[Kernel],
    reps: int = 20,
    warmup: int = 3,
    diagnose: bool = False,
    factor: float = accuracy.DEFAULT_FACTOR,
    on_progress: Callable[[str], None] | None = None,
) -> Verification:
    if not kernels:
        raise ValueError("no kernels to plug in")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ValueError(f"two kernels for one problem: {names}; verify one at a time")
    say = on_progress or (lambda msg: None)
    with torch.no_grad():
        own = _first_tensor(lm.model(*lm.inputs)).clone()
    say(f"running the model in {accuracy.higher_precision(lm.dtype)} for reference")
    ref_hi = accuracy.reference_output(lm.model, lm.inputs, lm.dtype, lambda m, a: _first_tensor(m(*a)))
    say(f"all {len(kernels)} kernel(s) plugged in")
    total = trial(lm, kernels, own, ref_hi, reps, warmup, factor)
    alone = []
    if diagnose:
        for i, k in enumerate(kernels, 1):
            say(f"diagnose {i}/{len(kernels)}: {k.name} alone")
            alone.append(trial(lm, [k], own, ref_hi, reps, warmup, factor))
    return Verification(
        lm.name,
        lm.device,
        str(lm.dtype).removeprefix("torch."),
        factor,
        reps,
        total,
        alone,
        {k.name: k.origin for k in kernels},
    )
