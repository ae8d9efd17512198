"""Is a model with kernels plugged in still as accurate as the model itself?

A fixed tolerance does not fit a whole model: each kernel rounds its output once, the
model's own code rounds differently, and a block's residual sums carry one rounding
error of the largest term into elements that cancel to near zero. So the yardstick is
the model's own rounding error: both the model and the plugged model are compared with
the model run in higher precision (float32 for 16-bit models, float64 for float32), and
the plugged model passes when its error is within ``factor`` times the model's own in
relative L2 norm, and within ``2 * factor`` times in the largest element, each plus one
unit of rounding of the dtype (so an exact model does not make the bar zero). NaN or
infinity where the high-precision run is finite always fails.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

DEFAULT_FACTOR = 2.0


def higher_precision(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def reference_output(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype, run) -> torch.Tensor:
    """The model's output in higher precision (a converted copy; the model is untouched)."""
    hi = higher_precision(dtype)
    twin = copy.deepcopy(model).to(hi)
    args = tuple(a.to(hi) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs)
    with torch.no_grad():
        out = run(twin, args)
    del twin
    return out.to(torch.float64)


@dataclass
class Errors:
    rel_l2: float
    max_abs: float
    nonfinite: int

    @staticmethod
    def of(out: torch.Tensor, ref_hi: torch.Tensor) -> Errors:
        x = out.to(torch.float64)
        finite = torch.isfinite(ref_hi)
        bad = int((~torch.isfinite(x) & finite).sum().item())
        err = torch.where(finite & torch.isfinite(x), x - ref_hi, torch.zeros_like(x))
        norm = float(torch.linalg.vector_norm(torch.where(finite, ref_hi, torch.zeros_like(ref_hi))).item())
        return Errors(float(torch.linalg.vector_norm(err).item()) / (norm or 1.0), float(err.abs().max().item()), bad)


@dataclass
class Check:
    ok: bool
    plugged: Errors
    own: Errors
    limit_rel_l2: float
    limit_max_abs: float
    message: str
    mismatch: bool = False  # the output's shape or dtype is not the model's

    @property
    def status(self) -> str:
        return "PASSED" if self.ok else "FAILED"


def check(
    out: torch.Tensor, own: torch.Tensor, ref_hi: torch.Tensor, dtype: torch.dtype, factor: float = DEFAULT_FACTOR
) -> Check:
    if out.shape != own.shape or out.dtype != own.dtype:
        e = Errors(float("inf"), float("inf"), 0)
        return Check(
            False,
            e,
            Errors.of(own, ref_hi),
            0.0,
            0.0,
            f"output is {out.dtype} {list(out.shape)}, the model's is {own.dtype} {list(own.shape)}",
            mismatch=True,
        )
    unit = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    mine, base = Errors.of(out, ref_hi), Errors.of(own, ref_hi)
    finite = ref_hi[torch.isfinite(ref_hi)]  # as ``Errors.of``: a NaN the model gives is no bar
    rms = float(finite.pow(2).mean().sqrt().item()) if finite.numel() else 0.0
    return judged(mine, base, factor * base.rel_l2 + unit, 2 * factor * base.max_abs + unit * rms)


def judged(mine: Errors, base: Errors, lim_l2: float, lim_max: float, mismatch: bool = False) -> Check:
    """The check's outcome and its message, from its figures alone (a NaN figure fails): what
    a sandboxed verification's figures are read back into (``job.VerificationResult``)."""
    if mismatch:
        return Check(False, mine, base, lim_l2, lim_max, "its output's shape or dtype is not the model's", True)
    problems = []
    if mine.nonfinite:
        problems.append(f"{mine.nonfinite} NaN/Inf elements where the model is finite")
    if not mine.rel_l2 <= lim_l2:
        problems.append(f"relative L2 error {mine.rel_l2:.3g} > {lim_l2:.3g} (the model's own {base.rel_l2:.3g})")
    if not mine.max_abs <= lim_max:
        problems.append(f"max abs error {mine.max_abs:.3g} > {lim_max:.3g} (the model's own {base.max_abs:.3g})")
    return Check(not problems, mine, base, lim_l2, lim_max, "; ".join(problems))
