"""Which fields of SOL-ExecBench's definition, workload and solution schemas a problem uses that
KernelArc does not honour yet, or honours differently; said field by field on import and in
the problem's listing.

The schemas are SOL-ExecBench's public ones (``docs/definition.md``, ``workload.md``,
``solution.md`` of NVIDIA/SOL-ExecBench). A field missing from the report is honoured as that
benchmark honours it; the rules below are the exceptions and their reasons.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from .problem import Problem
from . import tolerance as tolerance_mod
from .schema import Definition, Workload

Support = Literal["ignored", "partly", "unsupported", "informational"]

# Fields of SOL-ExecBench's definition schema that KernelArc reads (the rest it keeps unread).
DEFINITION_FIELDS = {
    "name",
    "op_type",
    "axes",
    "custom_inputs_entrypoint",
    "inputs",
    "outputs",
    "reference",
    "description",
    "constraints",
    "tags",
    "kernelarc",
}
# Informational upstream fields: kept in the problem, no bearing on judging.
INFORMATIONAL = {"hf_id"}
WORKLOAD_FIELDS = {"uuid", "axes", "inputs", "tolerance"}

# The solution schema, for every problem alike: what a submitted solution.json may set that is
# not honoured as SOL-ExecBench honours it.
SOLUTION_NOTES: list[tuple[str, Support, str]] = [
    (
        "solution.spec.target_hardware",
        "ignored",
        "a candidate is judged on this guard's device, whatever hardware it names",
    ),
    (
        "solution.spec.dependencies",
        "ignored",
        "not checked against the installed packages; a missing package fails at build with its name",
    ),
    (
        "solution.spec.languages",
        "partly",
        "pytorch, triton, cuda_cpp (cutlass, cublas, cudnn build as cuda_cpp), cute_dsl, cutile and "
        "tilelang (the last three with `pip install kernelarc-mcp[dsl]` and a GPU); cudnn_frontend is "
        "not supported",
    ),
    ("solution.spec.binding", "partly", "only 'torch' (the only binding SOL-ExecBench defines)"),
    (
        "solution.spec.compile_options",
        "partly",
        "cflags, cuda_cflags and ld_flags are passed to torch's extension loader for C++ solutions; "
        "without cuda_cflags KernelArc uses -O3 and the device's -gencode, not --use_fast_math",
    ),
]


class FieldNote(BaseModel):
    """One field a problem uses that KernelArc does not honour as SOL-ExecBench does."""

    field: str  # dotted path: "workload.tolerance.allow_negative_inf", "definition.hf_id"
    support: Support
    note: str

    def render(self) -> str:
        return f"{self.field}: {self.support}: {self.note}"


def definition_notes(d: Definition) -> list[FieldNote]:
    out = []
    for key in sorted(d.model_extra or {}):
        if key in INFORMATIONAL:
            out.append(
                FieldNote(field=f"definition.{key}", support="informational", note="kept; it does not bear on judging")
            )
        elif key not in DEFINITION_FIELDS:
            out.append(
                FieldNote(
                    field=f"definition.{key}",
                    support="ignored",
                    note="not a field KernelArc knows; kept in the problem, never read",
                )
            )
    return out


def workload_notes(workloads: list[Workload]) -> list[FieldNote]:
    """Notes on the fields the workloads use, each field once with how many workloads use it."""
    seen: dict[str, tuple[Support, str, int]] = {}

    def add(field: str, support: Support, note: str) -> None:
        prev = seen.get(field)
        seen[field] = (support, note, (prev[2] if prev else 0) + 1)

    for w in workloads:
        for key in sorted(w.model_extra or {}):
            if key not in WORKLOAD_FIELDS:
                add(f"workload.{key}", "ignored", "not a field KernelArc knows; kept, never read")
        if w.tolerance is not None and w.tolerance.allow_negative_inf:
            add(
                "workload.tolerance.allow_negative_inf",
                "partly",
                "KernelArc always accepts an output that has the reference's -inf, +inf or NaN in "
                "the same place, with or without this flag; SOL-ExecBench rejects any non-finite "
                "value except -inf matched under this flag",
            )
    return [
        FieldNote(field=f, support=s, note=f"{n} of {len(workloads)} workloads: {note}")
        for f, (s, note, n) in sorted(seen.items())
    ]


def tolerance_notes(d: Definition, workloads: list[Workload]) -> list[FieldNote]:
    """Outputs held to a tighter tolerance than SOL-ExecBench's defaults on workloads that set
    no tolerance of their own."""
    bare = [w for w in workloads if w.tolerance is None]
    if not bare:
        return []
    out = []
    for name, tol in tolerance_mod.for_workload(d, bare[0]).items():
        if tol.stricter:
            out.append(
                FieldNote(
                    field=f"workload.tolerance (output {name})",
                    support="partly",
                    note=f"{len(bare)} of {len(workloads)} workloads set none: {tol.stricter}",
                )
            )
    return out


def solution_notes() -> list[FieldNote]:
    return [FieldNote(field=f, support=s, note=n) for f, s, n in SOLUTION_NOTES]


def problem_notes(problem: Problem, include_solution: bool = True) -> list[FieldNote]:
    """Everything of the problem (and of solutions in general) not honoured as upstream."""
    notes = definition_notes(problem.definition)
    notes += workload_notes(problem.workloads + problem.heldout)
    notes += tolerance_notes(problem.definition, problem.workloads + problem.heldout)
    if include_solution:
        notes += solution_notes()
    return notes
