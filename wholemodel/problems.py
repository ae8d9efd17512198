"""Writing a profile's top kernels as problems in the native schema.

Each site's family has a seed problem that serves as the template: its reference, input
generator, formulas and tags carry over; the axes, dtypes and workloads become the
model's. Kernels of one family and the same constants (an RMSNorm's eps and hidden size)
become one problem with one workload per distinct shape, so one kernel serves them all,
as it will when ``kernelarc verify`` plugs it into the model.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from guard.problems.problem import Problem, load_problem
from guard.problems.schema import Definition, Workload
from seeds import SEEDS_DIR

from .profile import Entry, Profile
from .sites import BY_FAMILY

TEMPLATE_DTYPE = "bfloat16"  # every template is a bf16 problem


@dataclass
class Planned:
    """A problem to write: a family, its constants, and the kernels whose shapes it takes."""

    family: str
    constants: dict[str, float]
    entries: list[Entry]

    @property
    def share(self) -> float:
        return sum(e.share for e in self.entries)


def plan(profile: Profile, top: int) -> tuple[list[Planned], list[Entry]]:
    """The problems for the ``top`` largest kernels a site can serve, and the larger
    kernels skipped because no site can (listed, never dropped silently)."""
    chosen: list[Entry] = []
    skipped: list[Entry] = []
    for e in profile.entries:
        if len(chosen) == top:
            break
        (chosen if e.pluggable and e.family in BY_FAMILY else skipped).append(e)
    planned: dict[tuple, Planned] = {}
    for e in chosen:
        const_axes = _const_axes(e.family, e.axes)
        key = (e.family, tuple(sorted(e.constants.items())), tuple(sorted(const_axes.items())))
        planned.setdefault(key, Planned(e.family, e.constants, [])).entries.append(e)
    return list(planned.values()), skipped


def _template(family: str) -> Problem:
    return load_problem(SEEDS_DIR / BY_FAMILY[family].template, origin="seed")


def _const_axes(family: str, axes: dict[str, int]) -> dict[str, int]:
    d = _template(family).definition
    return {a: axes[a] for a, spec in d.axes.items() if spec.type == "const"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text)


def build_problem(p: Planned, profile: Profile, name: str) -> Problem:
    site = BY_FAMILY[p.family]
    template = _template(p.family)
    t = template.definition.to_json()
    dtype = profile.dtype
    elem = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    const_axes = _const_axes(p.family, p.entries[0].axes)

    d = copy.deepcopy(t)
    d["name"] = name
    modules = sorted({m for e in p.entries for m in e.modules})
    d["description"] = (
        site.summary.format(dtype=dtype, **p.constants)
        + f" From profiling {profile.model} ({', '.join(modules)}) on {profile.device}."
    )
    for axis, value in const_axes.items():
        d["axes"][axis]["value"] = value
        d["axes"][axis]["description"] = f"{profile.model}'s value"
    for spec in list(d["inputs"].values()) + list(d["outputs"].values()):
        if spec.get("shape") is not None and spec["dtype"] == TEMPLATE_DTYPE:
            spec["dtype"] = dtype
    d["reference"] = _reference(t["reference"], dtype, p)
    ka = d.setdefault("kernelarc", {})
    if ka.get("bytes") and elem != 2:  # template formulas count 2 bytes per element
        ka["bytes"] = f"({ka['bytes']}) * {elem} / 2"
    ka["cpu_workloads"] = None  # derived from the model's shapes by the guard
    ka["models"] = [f"{profile.model}: {', '.join(modules)}"]
    ka["source"] = {
        "format": "kernelarc-profile",
        "model": profile.model,
        "device": profile.device,
        "dtype": dtype,
        "template": site.template,
        "share": round(p.share, 4),
        "constants": p.constants,
    }
    definition = Definition.model_validate(d)

    input_types = template.workloads[0].inputs
    workloads = []
    for e in p.entries:
        var_axes = {a: v for a, v in e.axes.items() if a in definition.var_axes}
        inputs = {}
        for iname, spec in input_types.items():
            if iname in e.scalars:
                inputs[iname] = {"type": "scalar", "value": e.scalars[iname]}
            else:
                inputs[iname] = spec.model_dump(mode="json", exclude_none=True)
        uuid = _safe(f"{profile.model}-{p.family}-" + "-".join(f"{a}{v}" for a, v in var_axes.items()))[:120]
        if uuid not in {w.uuid for w in workloads}:
            workloads.append(Workload.model_validate({"uuid": uuid, "axes": var_axes, "inputs": inputs}))
    return Problem(definition, workloads, origin="workspace")


def _reference(text: str, dtype: str, p: Planned) -> str:
    out = text.replace(f"torch.{TEMPLATE_DTYPE}", f"torch.{dtype}")
    if "eps" in p.constants:  # the rmsnorm template bakes eps 1e-5 into its reference
        eps = p.constants["eps"]
        if eps != 1e-5:
            if "1e-5" not in out:
                raise ValueError(f"template of {p.family} does not spell its eps as 1e-5")
            out = out.replace("1e-5", repr(eps))
    return out


def write_problems(
    profile: Profile, top: int, out_dir: Path, prefix: str | None = None
) -> tuple[list[Path], list[Entry]]:
    """Write the planned problems under ``out_dir``; returns their folders and the skipped kernels."""
    planned, skipped = plan(profile, top)
    prefix = _safe(prefix or profile.model)
    folders = []
    by_family: dict[str, int] = {}
    for p in planned:
        by_family[p.family] = by_family.get(p.family, 0) + 1
    seen: dict[str, int] = {}
    for p in planned:
        name = f"{prefix}_{p.family}"
        if by_family[p.family] > 1:  # several constants of one family: tell them apart
            seen[p.family] = seen.get(p.family, 0) + 1
            name += f"_{seen[p.family]}"
        problem = build_problem(p, profile, name)
        folder = Path(out_dir) / name
        problem.save(folder)
        load_problem(folder)  # what we wrote must read back
        folders.append(folder)
    return folders, skipped
