"""Correctness of one candidate output against the reference output (trusted worker).

An element passes when ``|out - ref| <= atol + rtol * |ref|`` (torch.allclose's rule), or
when both are the same infinity, or both NaN where the reference itself is NaN. A NaN or an
infinity where the reference is finite always fails. Shapes and dtypes must match exactly.

SOL-ExecBench's tolerance spec lets a share of the elements miss (``required_matched_ratio``,
0.99 by default: bf16 rounding differs between two honest orders of operations) and caps
the largest error (``max_error_cap``). Both are honoured. KernelArc adds one bound of its
own, stricter than SOL-ExecBench, and the message names it when it fires: an element let
through by the ratio must still be off by rounding, at most ``OUTLIER_FACTOR`` times its
allowance. An unmasked tail, a skipped row or a wrong index is off by the size of the values
themselves, and on a wide tensor it stays under 1% of the elements.
"""

from __future__ import annotations

import math

import torch

# How far past its allowance (atol + rtol * |ref|) an element the matched ratio lets through
# may be. bf16 carries 8 bits of mantissa: an honest difference in rounding order is a few
# units in the last place, about one allowance at rtol 1e-2; a defect is far more.
OUTLIER_FACTOR = 8.0


def spec_args(tol: dict) -> dict:
    """The keyword arguments of ``compare`` beyond atol/rtol, from a tolerance message."""
    ratio = tol.get("required_matched_ratio")
    return {"matched_ratio": 1.0 if ratio is None else float(ratio),
            "error_cap": tol.get("max_error_cap")}


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index = flat_index // dim if dim else 0
    return list(reversed(idx))


def compare(
    out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, name: str = "output",
    row_scaled: bool = False, matched_ratio: float = 1.0, error_cap: float | None = None,
) -> dict:
    """A report: ``ok``, ``status``, ``message`` and error statistics.

    ``matched_ratio``: the share of elements that must be within atol/rtol (SOL-ExecBench's
    ``required_matched_ratio``; 1.0: all). ``error_cap``: the largest absolute error allowed
    anywhere (its ``max_error_cap``).

    ``row_scaled`` (adversarial rounds): the allowance also grows with the root mean square
    of the reference's row (last dimension), since a sum over terms of a row's magnitude
    carries rounding of that magnitude wherever it cancels to a small value. Overflow, NaN,
    and errors of the order of the row itself still fail."""
    if out.dtype != ref.dtype:
        return _fail("INCORRECT_DTYPE", f"{name}: dtype {_dt(out)}, expected {_dt(ref)}")
    if tuple(out.shape) != tuple(ref.shape):
        return _fail(
            "INCORRECT_SHAPE", f"{name}: shape {list(out.shape)}, expected {list(ref.shape)}"
        )
    if out.numel() == 0:
        return {"ok": True, "status": "PASSED", "max_abs": 0.0, "max_rel": 0.0}
    if not (out.is_floating_point() or out.is_complex()):
        diff = out != ref
        bad = int(diff.sum().item())
        if bad:
            first = int(diff.reshape(-1).nonzero()[0].item())
            where = _index(first, tuple(ref.shape))
            return _fail(
                "INCORRECT_NUMERICAL",
                f"{name}: {bad} of {out.numel()} elements differ (exact match required); "
                f"first at {where}: got {out.reshape(-1)[first].item()}, expected {ref.reshape(-1)[first].item()}",
                mismatches=bad,
            )
        return {"ok": True, "status": "PASSED", "max_abs": 0.0, "max_rel": 0.0}

    x = out.to(torch.float64)
    y = ref.to(torch.float64)
    ref_finite = torch.isfinite(y)
    out_finite = torch.isfinite(x)
    same_special = (~ref_finite) & (((x == y) & torch.isinf(y)) | (torch.isnan(x) & torch.isnan(y)))
    nonfinite_bad = (~out_finite) & ref_finite
    err = torch.where(ref_finite & out_finite, (x - y).abs(), torch.zeros_like(x))
    allowed = atol + rtol * y.abs()
    if row_scaled and y.dim() >= 1:
        finite_y = torch.where(ref_finite, y, torch.zeros_like(y))
        allowed = allowed + rtol * finite_y.pow(2).mean(dim=-1, keepdim=True).sqrt()
    fails = (ref_finite & out_finite & (err > allowed)) | nonfinite_bad | (~ref_finite & ~same_special)
    max_abs = float(err.max().item())
    rel = err / torch.clamp(y.abs(), min=max(atol, 1e-30))
    rel = torch.where(ref_finite, rel, torch.zeros_like(rel))
    max_rel = float(rel.max().item())
    n_fail = int(fails.sum().item())
    numel = out.numel()
    stats = {"max_abs": max_abs, "max_rel": max_rel, "mismatches": n_fail, "numel": numel,
             "matched_ratio": 1.0 - n_fail / numel}
    if error_cap is not None and max_abs > error_cap:
        worst_where = _index(int(err.reshape(-1).argmax().item()), tuple(ref.shape))
        return _fail("INCORRECT_NUMERICAL",
                     f"{name}: max abs error {max_abs:.3g} at {worst_where} exceeds the workload's "
                     f"max_error_cap={error_cap:g} (SOL-ExecBench's tolerance spec)", **stats)
    if n_fail == 0:
        return {"ok": True, "status": "PASSED", **stats}
    if 1.0 - n_fail / numel >= matched_ratio:
        verdict = _within_ratio(x, y, err, allowed, fails, nonfinite_bad, ref_finite, name,
                                matched_ratio, stats)
        if verdict is not None:
            return verdict
    flat_fail = fails.reshape(-1)
    first = int(flat_fail.nonzero()[0].item())
    where = _index(first, tuple(ref.shape))
    got, want = x.reshape(-1)[first].item(), y.reshape(-1)[first].item()
    n_nan = int((torch.isnan(x) & ref_finite).sum().item())
    n_inf = int((torch.isinf(x) & ref_finite).sum().item())
    worst = int(torch.where(fails, err - allowed, torch.full_like(err, -1.0)).reshape(-1).argmax().item())
    worst_where = _index(worst, tuple(ref.shape))
    allowance = math.floor((1.0 - matched_ratio) * numel + 1e-9)
    parts = [
        f"{name}: {n_fail} of {numel} elements outside atol={atol:g} rtol={rtol:g}"
        + (" (+ rtol x row RMS)" if row_scaled else "")
        + (f", more than the {allowance} that required_matched_ratio={matched_ratio:g} allows"
           if matched_ratio < 1.0 else ""),
        f"first at {where}: got {got:.6g}, expected {want:.6g}",
        f"max abs error {max_abs:.3g} at {worst_where}, max rel error {max_rel:.3g}",
    ]
    if n_nan or n_inf:
        parts.append(f"{n_nan} NaN and {n_inf} Inf where the reference is finite")
    return _fail("INCORRECT_NUMERICAL", "; ".join(parts), nan=n_nan, inf=n_inf, **stats)


def _within_ratio(x, y, err, allowed, fails, nonfinite_bad, ref_finite, name: str,
                  matched_ratio: float, stats: dict) -> dict | None:
    """Few enough elements miss for the matched ratio. None when they are rounding-sized (the
    output passes); a failure naming the check otherwise."""
    shape = tuple(y.shape)
    bad_special = nonfinite_bad | (fails & ~ref_finite)
    if bool(bad_special.any()):
        first = int(bad_special.reshape(-1).nonzero()[0].item())
        return _fail("INCORRECT_NUMERICAL",
                     f"{name}: a NaN or Inf at {_index(first, shape)} where the reference has "
                     f"{y.reshape(-1)[first].item():.6g}: required_matched_ratio={matched_ratio:g} "
                     "lets finite rounding through, never a non-finite value (SOL-ExecBench rejects "
                     "those too)", **stats)
    excess = torch.where(fails, err / allowed.clamp(min=1e-300), torch.zeros_like(err))
    worst = int(excess.reshape(-1).argmax().item())
    factor = float(excess.reshape(-1)[worst].item())
    if factor > OUTLIER_FACTOR:
        n_out = int((excess > OUTLIER_FACTOR).sum().item())
        return _fail("INCORRECT_NUMERICAL",
                     f"{name}: KernelArc's outlier bound, stricter than SOL-ExecBench: {n_out} elements "
                     f"are off by more than {OUTLIER_FACTOR:g}x their allowance (worst at "
                     f"{_index(worst, shape)}: got {x.reshape(-1)[worst].item():.6g}, expected "
                     f"{y.reshape(-1)[worst].item():.6g}, {factor:.3g}x). The {stats['mismatches']} of "
                     f"{stats['numel']} elements outside tolerance are within required_matched_ratio="
                     f"{matched_ratio:g}, but that ratio is for rounding: an error this size is a defect "
                     "(an unmasked tail, a skipped element, a wrong index)", outlier_factor=factor, **stats)
    return {"ok": True, "status": "PASSED", "within_ratio": True, "outlier_factor": factor, **stats}


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _fail(status: str, message: str, **stats) -> dict:
    return {"ok": False, "status": status, "message": message, **stats}
