"""One-line summaries of problems for listings (CLI, MCP)."""

from __future__ import annotations

from typing import Any

from .derive import largest_tensor
from .problem import Problem
from .sol_fidelity import problem_notes


def summarize(problem: Problem) -> dict[str, Any]:
    d = problem.definition
    sizes = []
    for w in problem.workloads:
        try:
            axes = d.resolve_axes(w.axes)
            sizes.append((d.io_bytes(axes), d.flops(axes)))
        except ValueError:
            continue
    max_bytes = max((s[0] for s in sizes), default=0.0)
    flops = [s[1] for s in sizes if s[1] is not None]
    dtypes = sorted({s.dtype for s in list(d.inputs.values()) + list(d.outputs.values())})
    return {
        "name": d.name,
        "origin": problem.origin,
        "op_family": d.kernelarc.op_family or "other",
        "op_type": d.op_type,
        "bound": d.kernelarc.bound,
        "workloads": len(problem.workloads),
        "dtypes": dtypes,
        "max_io_bytes": max_bytes,
        "max_flops": max(flops) if flops else None,
        "largest_tensor_elements": max((largest_tensor(d, w.axes) for w in problem.workloads), default=0),
        "seed_kernels": sorted(problem.seed_kernels()),
        "description": (d.description or "").strip().splitlines()[0][:200] if d.description else "",
        # the fields of SOL-ExecBench's schema this problem uses that are not honoured as there
        "not_honoured": [n.render() for n in problem_notes(problem, include_solution=False)],
    }


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"
