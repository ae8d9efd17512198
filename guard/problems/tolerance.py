"""The tolerance each output of a workload is judged by, and where it is stricter than
SOL-ExecBench.

SOL-ExecBench judges every workload by its ``tolerance`` spec, or by the spec's defaults when
the workload sets none (atol = rtol = 1e-2, 99% of the elements within them, no error cap).
KernelArc follows it, with one difference it names whenever it matters:

- a workload that sets ``tolerance`` is judged by it exactly (atol, rtol, matched ratio, cap);
- a workload that sets none is judged by the problem's own per-dtype tolerances
  (``kernelarc.tolerance``, else the dtype's default: 1e-4 for float32, 1e-7 for float64, 1e-2
  for 16-bit floats). Where those are SOL-ExecBench's default bounds or looser (bf16, fp16,
  fp8), its default matched ratio (0.99) applies too. Where they are tighter (float32,
  float64), every element must be within them, as before: a ratio sized for 1e-2 does not carry
  over to 1e-4. That is stricter than SOL-ExecBench, and a rejection says so.

Integer and bool outputs must match exactly in every case (``guard/runner/compare.py``). The
atol chosen here is an upper bound: an output far smaller than it is held to at most
10 x rtol x the reference output's root mean square, with floors from the reference's own
error against float64 and the dtype's spacing, and the stated atol where the output is mostly
rounding or no float64 reference can run (``guard/runner/held_atol.py``).
"""

from __future__ import annotations

from pydantic import BaseModel

from .dtypes import DTYPES
from .schema import Definition, ToleranceSpec, Workload

SOL_DEFAULT = ToleranceSpec()


class OutputTolerance(BaseModel):
    """How one output of one workload is compared with the reference."""

    atol: float
    rtol: float
    required_matched_ratio: float
    max_error_cap: float | None = None
    origin: str  # "workload" (its tolerance spec), "kernelarc" (the problem's), "dtype"
    stricter: str | None = None  # why this is stricter than SOL-ExecBench would be, if it is

    def message(self) -> dict[str, float | None]:
        """The fields the trusted worker's compare request takes (runner/messages.Tolerance)."""
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "required_matched_ratio": self.required_matched_ratio,
            "max_error_cap": self.max_error_cap,
        }


def for_output(d: Definition, w: Workload, dtype: str) -> OutputTolerance:
    if w.tolerance is not None:
        t = w.tolerance
        return OutputTolerance(
            atol=t.max_atol,
            rtol=t.max_rtol,
            required_matched_ratio=t.required_matched_ratio,
            max_error_cap=t.max_error_cap,
            origin="workload",
            stricter=_integer_note(dtype),
        )
    own = d.tolerance_for(dtype)
    origin = "kernelarc" if dtype in d.kernelarc.tolerance else "dtype"
    stricter = _integer_note(dtype)
    tighter = own.atol < SOL_DEFAULT.max_atol or own.rtol < SOL_DEFAULT.max_rtol
    if stricter is None and tighter:
        which = "this problem's" if origin == "kernelarc" else "KernelArc's default"
        stricter = (
            f"{which} {dtype} tolerance atol={own.atol:g} rtol={own.rtol:g}, stricter than "
            f"SOL-ExecBench's default {SOL_DEFAULT.max_atol:g} for a workload that sets none: "
            f"{dtype} outputs are held to {dtype} accuracy on every element (no TF32 or bf16 shortcuts)"
        )
    return OutputTolerance(
        atol=own.atol,
        rtol=own.rtol,
        required_matched_ratio=1.0 if tighter else SOL_DEFAULT.required_matched_ratio,
        max_error_cap=SOL_DEFAULT.max_error_cap,
        origin=origin,
        stricter=stricter,
    )


def for_workload(d: Definition, w: Workload) -> dict[str, OutputTolerance]:
    """Each output's tolerance on ``w``, by output name, in the definition's order."""
    return {name: for_output(d, w, spec.dtype) for name, spec in d.outputs.items()}


def _integer_note(dtype: str) -> str | None:
    if DTYPES[dtype].is_float:
        return None
    return (
        f"KernelArc requires {dtype} outputs to match exactly, stricter than SOL-ExecBench's "
        "tolerance: an index or count off by one is wrong, not rounded"
    )


def view(d: Definition, workloads: list[Workload]) -> dict[str, dict[str, float]]:
    """Per output, the tolerance an agent is told: that of the first workload (atol, rtol,
    required_matched_ratio, and max_error_cap when set)."""
    if not workloads:
        return {k: d.tolerance_for(s.dtype).model_dump() for k, s in d.outputs.items()}
    out = {}
    for name, t in for_workload(d, workloads[0]).items():
        out[name] = {k: v for k, v in t.message().items() if v is not None}
    return out
