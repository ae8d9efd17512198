"""Correctness of one candidate output against the reference output (trusted worker).

An element passes when ``|out - ref| <= atol + rtol * |ref|`` (torch.allclose's rule), or
when both are the same infinity, or both NaN where the reference itself is NaN. A NaN or an
infinity where the reference is finite always fails. Shapes and dtypes must match exactly.
"""

from __future__ import annotations

import torch


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index = flat_index // dim if dim else 0
    return list(reversed(idx))


def compare(
    out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, name: str = "output",
    row_scaled: bool = False,
) -> dict:
    """A report: ``ok``, ``status``, ``message`` and error statistics.

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
    stats = {"max_abs": max_abs, "max_rel": max_rel, "mismatches": n_fail, "numel": out.numel()}
    if n_fail == 0:
        return {"ok": True, "status": "PASSED", **stats}
    flat_fail = fails.reshape(-1)
    first = int(flat_fail.nonzero()[0].item())
    where = _index(first, tuple(ref.shape))
    got, want = x.reshape(-1)[first].item(), y.reshape(-1)[first].item()
    n_nan = int((torch.isnan(x) & ref_finite).sum().item())
    n_inf = int((torch.isinf(x) & ref_finite).sum().item())
    worst = int(torch.where(fails, err - allowed, torch.full_like(err, -1.0)).reshape(-1).argmax().item())
    worst_where = _index(worst, tuple(ref.shape))
    parts = [
        f"{name}: {n_fail} of {out.numel()} elements outside atol={atol:g} rtol={rtol:g}"
        + (" (+ rtol x row RMS)" if row_scaled else ""),
        f"first at {where}: got {got:.6g}, expected {want:.6g}",
        f"max abs error {max_abs:.3g} at {worst_where}, max rel error {max_rel:.3g}",
    ]
    if n_nan or n_inf:
        parts.append(f"{n_nan} NaN and {n_inf} Inf where the reference is finite")
    return _fail("INCORRECT_NUMERICAL", "; ".join(parts), **stats)


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _fail(status: str, message: str, **stats) -> dict:
    return {"ok": False, "status": status, "message": message, **stats}
