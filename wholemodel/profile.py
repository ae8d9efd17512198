"""Profiling a model: where its time goes, by op family, and what speeding each part up
would give the whole model (Amdahl's law).

Every module's forward, and every site's replaceable method (see ``sites``), runs inside
a ``record_function`` scope, so each aten op the profiler sees can be traced to what ran
it. An op belongs to the nearest site above it (a site absorbing a child, like SwiGLU's
gate and up projections, takes that child's ops); else to the innermost module whose
class names a family; else to its own aten name's family and, on the GPU, to the family
of the kernels it launched. What none of these name stays "other" and is listed as such.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from guard.problems.families import classify

from .loader import LoadedModel
from .sites import Placement, placements, wrap_method

MODULE_SCOPE = "ka_module::"
SITE_SCOPE = "ka_site::"
# Modules whose time is their children's: containers never name a family.
CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


@dataclass
class Entry:
    """One kernel of the ranking: a family at one shape, wherever in the model it runs."""

    family: str
    where: str  # the module class, or the aten op for ops outside any module that names a family
    axes: dict[str, int] | None = None  # problem axes, for entries a site can serve
    constants: dict[str, float] = field(default_factory=dict)  # see Site.constants
    scalars: dict[str, float] = field(default_factory=dict)  # see Site.scalars
    modules: list[str] = field(default_factory=list)
    calls: float = 0.0  # per forward (sites only)
    time_ms: float = 0.0  # per forward
    share: float = 0.0  # of the profiled op time
    ops: dict[str, float] = field(default_factory=dict)  # aten op -> ms per forward
    kernels: dict[str, float] = field(default_factory=dict)  # GPU kernel -> ms per forward

    @property
    def pluggable(self) -> bool:
        return self.axes is not None

    def amdahl(self, factor: float) -> float:
        """The whole model's speedup if this kernel alone got ``factor`` times faster."""
        return 1.0 / ((1.0 - self.share) + self.share / factor)


@dataclass
class Profile:
    model: str
    device: str
    dtype: str
    forward_ms: float  # median wall time of one forward, outside the profiler
    profiled_ms: float  # op time per forward the profiler saw (device time on the GPU)
    entries: list[Entry]
    reps: int

    def by_family(self) -> list[tuple[str, float, float]]:
        """(family, ms per forward, share), largest first."""
        acc: dict[str, float] = defaultdict(float)
        for e in self.entries:
            acc[e.family] += e.time_ms
        return sorted(((f, t, t / (self.profiled_ms or 1.0)) for f, t in acc.items()), key=lambda x: -x[1])

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "reps": self.reps,
            "forward_ms": self.forward_ms,
            "profiled_ms": self.profiled_ms,
            "entries": [{**e.__dict__, "amdahl": {f"x{f:g}": e.amdahl(f) for f in FACTORS}} for e in self.entries],
            "families": [{"family": f, "ms": t, "share": s} for f, t, s in self.by_family()],
        }


FACTORS = (1.5, 2.0, 3.0)


def _family_of_module(module: torch.nn.Module) -> str:
    fam = classify(type(module).__name__)
    if fam == "other" and isinstance(module, torch.nn.Linear):
        return "matmul"
    return fam


class _Scopes:
    """Installs the profiling scopes and remembers what each site label stands for."""

    def __init__(self, model: torch.nn.Module):
        self.undo: list = []
        self.site_calls: dict[str, tuple[Placement, tuple | None]] = {}  # label -> (placement, axes items)
        self.owner: dict[str, str] = {}  # site qual -> the qual of the site that owns its time
        self.placements = {p.qual: p for p in placements(model)}
        for p in self.placements.values():
            for child in p.site.absorbs:
                self.owner[f"{p.qual}.{child}" if p.qual else child] = p.qual
        for qual, module in model.named_modules():
            if qual and not isinstance(module, CONTAINERS):
                self._module_scope(module, f"{MODULE_SCOPE}{qual}::{type(module).__name__}")
        for p in self.placements.values():
            self._site_scope(p)

    def _module_scope(self, module, label: str) -> None:
        stack: list = []

        def pre(mod, args):
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)

        def post(mod, args, out):
            stack.pop().__exit__(None, None, None)

        self.undo.append(module.register_forward_pre_hook(pre).remove)
        self.undo.append(module.register_forward_hook(post).remove)

    def _site_scope(self, p: Placement) -> None:
        def wrapper(original, args, kwargs):
            axes = p.site.axes(p.module, args) if not kwargs else None
            key = None if axes is None else tuple(axes.items())
            label = f"{SITE_SCOPE}{p.qual}::{json.dumps(axes, separators=(',', ':'))}"
            self.site_calls[label] = (p, key)
            with record_function(label):
                return original(*args, **kwargs)

        self.undo.append(wrap_method(p.module, p.site.method, wrapper))

    def owner_of(self, qual: str) -> str:
        while qual in self.owner:
            qual = self.owner[qual]
        return qual

    def remove(self) -> None:
        for undo in reversed(self.undo):
            undo()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_forward(model, inputs, device: str, reps: int) -> list[float]:
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(*inputs)
        _sync(device)
        walls.append((time.perf_counter() - t0) * 1e3)
    return walls


def profile_model(m: LoadedModel, warmup: int = 3, reps: int = 5) -> Profile:
    model, inputs, cuda = m.model, m.inputs, m.device == "cuda"
    with torch.no_grad():
        for _ in range(warmup):
            model(*inputs)
        _sync(m.device)
        walls = time_forward(model, inputs, m.device, max(reps, 5))
        families = {qual: _family_of_module(mod) for qual, mod in model.named_modules() if qual}
        types = {qual: type(mod).__name__ for qual, mod in model.named_modules() if qual}
        scopes = _Scopes(model)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        try:
            with profile(activities=activities) as prof:
                for _ in range(reps):
                    model(*inputs)
                _sync(m.device)
        finally:
            scopes.remove()

    groups: dict[tuple, Entry] = {}
    site_events: dict[tuple, set] = defaultdict(set)  # entry key -> site event ids (to count calls)
    for ev in prof.events():
        if not ev.name.startswith("aten::"):
            continue
        self_ms = (ev.self_device_time_total if cuda else ev.self_cpu_time_total) / 1000.0 / reps
        if self_ms <= 0:
            continue
        site_ev, module_qual, parent = None, None, ev.cpu_parent
        while parent is not None:
            if parent.name.startswith(SITE_SCOPE) and parent.name in scopes.site_calls:
                p, _ = scopes.site_calls[parent.name]
                owner = scopes.owner_of(p.qual)
                if owner == p.qual or site_ev is None:
                    site_ev = parent  # keep climbing: an absorbing site above takes precedence
                if owner == p.qual:
                    break
            elif parent.name.startswith(MODULE_SCOPE) and module_qual is None:
                qual = parent.name[len(MODULE_SCOPE) :].rsplit("::", 1)[0]
                if families.get(qual, "other") != "other":
                    module_qual = qual
            parent = parent.cpu_parent
        if site_ev is not None:
            p, axes = scopes.site_calls[site_ev.name]
            consts = p.site.constants(p.module)
            key = (p.site.family, type(p.module).__name__, axes, tuple(consts.items()))
            entry = groups.get(key) or groups.setdefault(
                key,
                Entry(p.site.family, key[1], None if axes is None else dict(axes), consts, p.site.scalars(p.module)),
            )
            qual = p.qual
            site_events[key].add(site_ev.id)
        elif module_qual is not None:
            where = types[module_qual]
            if module_qual in scopes.placements:  # e.g. GQAttention's reshapes around attend()
                where += f" (outside {scopes.placements[module_qual].site.method})"
            key = (families[module_qual], where, None, ())
            entry = groups.setdefault(key, Entry(key[0], where))
            qual = module_qual
        else:
            family = classify(ev.name.removeprefix("aten::"))
            if cuda and family == "other":
                family = next((f for f in (classify(k.name) for k in ev.kernels) if f != "other"), "other")
            key = (family, ev.name, None, ())
            entry = groups.setdefault(key, Entry(family, ev.name))
            qual = None
        if qual is not None and qual not in entry.modules:
            entry.modules.append(qual)
        entry.time_ms += self_ms
        entry.ops[ev.name] = entry.ops.get(ev.name, 0.0) + self_ms
        if cuda:
            for k in ev.kernels:
                entry.kernels[k.name] = entry.kernels.get(k.name, 0.0) + k.duration / 1000.0 / reps
    for key, ids in site_events.items():
        groups[key].calls = len(ids) / reps
    entries = sorted(groups.values(), key=lambda e: -e.time_ms)
    total = sum(e.time_ms for e in entries)
    for e in entries:
        e.share = e.time_ms / total if total else 0.0
    return Profile(m.name, m.device, str(m.dtype).replace("torch.", ""), statistics.median(walls), total, entries, reps)
