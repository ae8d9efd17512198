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
from collections.abc import Callable
from typing import Any

import torch

from .common import dtype_name
from .compare_scan import Scan, all_within, scan_exact, scan_floats
from .held_atol import NO_GAP, UNKNOWN_GAP, HeldAtol, ReferenceGap, held_atol, reference_gap, resolution, rms
from .messages import DEFAULT_CHUNK_ELEMENTS

# How far past its allowance (atol + rtol * |ref|) an element the matched ratio lets through
# may be. bf16 carries 8 bits of mantissa: an honest difference in rounding order is a few
# units in the last place, about one allowance at rtol 1e-2; a defect is far more.
OUTLIER_FACTOR = 8.0


def spec_args(tol: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``compare`` beyond atol/rtol, from a tolerance message."""
    ratio = tol.get("required_matched_ratio")
    return {"matched_ratio": 1.0 if ratio is None else float(ratio), "error_cap": tol.get("max_error_cap")}


def _index(flat_index: int, shape: tuple[int, ...]) -> list[int]:
    idx = []
    for dim in reversed(shape):
        idx.append(flat_index % dim if dim else 0)
        flat_index = flat_index // dim if dim else 0
    return list(reversed(idx))


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float,
    rtol: float,
    name: str = "output",
    row_scaled: bool = False,
    matched_ratio: float = 1.0,
    error_cap: float | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    same_dtype: bool = True,
    figures: bool = True,
    scale: bool = True,
    gap: ReferenceGap = NO_GAP,
) -> dict[str, Any]:
    """A report: ``ok``, ``status``, ``message`` and error statistics.

    ``matched_ratio``: the share of elements that must be within atol/rtol (SOL-ExecBench's
    ``required_matched_ratio``; 1.0: all). ``error_cap``: the largest absolute error allowed
    anywhere (its ``max_error_cap``).

    ``row_scaled`` (adversarial rounds): the allowance also grows with the root mean square
    of the reference's row (last dimension), since a sum over terms of a row's magnitude
    carries rounding of that magnitude wherever it cancels to a small value. Overflow, NaN,
    and errors of the order of the row itself still fail.

    The elements are read ``chunk_elements`` at a time (``compare_scan``): no float64 copy of
    a whole output is ever made. ``same_dtype=False`` compares values only (the float64
    recheck, against a reference evaluated in float64). ``figures=False`` (a check of many
    outputs, which reads only a failure): a float output in which no element fails reports no
    error statistics, and is scanned for them only when one does.

    ``scale``: ``atol`` is held down to the reference's own size (``held_atol``), with the
    floors that ``gap`` gives (how far the reference lies from its float64 evaluation, where
    known). False compares two results of one kernel (its repeats): their rounding noise is
    not proportional to the output's size."""
    if same_dtype and out.dtype != ref.dtype:
        return _fail("INCORRECT_DTYPE", f"{name}: dtype {dtype_name(out)}, expected {dtype_name(ref)}")
    if tuple(out.shape) != tuple(ref.shape):
        return _fail("INCORRECT_SHAPE", f"{name}: shape {list(out.shape)}, expected {list(ref.shape)}")
    if out.numel() == 0:
        return {"ok": True, "status": "PASSED", "max_abs": 0.0, "max_rel": 0.0}
    if not (out.is_floating_point() or out.is_complex()):
        exact = scan_exact(out, ref, chunk_elements)
        if exact.mismatches:
            where = _index(exact.first.index, tuple(ref.shape))
            return _fail(
                "INCORRECT_NUMERICAL",
                f"{name}: {exact.mismatches} of {out.numel()} elements differ (exact match required); "
                f"first at {where}: got {exact.first.got}, expected {exact.first.want}",
                mismatches=exact.mismatches,
            )
        return {"ok": True, "status": "PASSED", "max_abs": 0.0, "max_rel": 0.0}

    # a complex output never meets the float64 recheck that floors the held atol: its stated one
    if scale and ref.is_floating_point() and atol > 0 and rtol > 0:  # else nothing to scale: no pass over ref
        held = held_atol(atol, rtol, rms(ref, chunk_elements), gap, resolution(out.dtype))
    else:
        held = HeldAtol(atol, atol, math.nan)
    atol = held.atol
    if not figures and all_within(out, ref, atol, rtol, row_scaled, error_cap, chunk_elements):
        return {"ok": True, "status": "PASSED"}
    scan = scan_floats(out, ref, atol, rtol, row_scaled, OUTLIER_FACTOR, chunk_elements)
    shape = tuple(ref.shape)
    max_abs, max_rel, n_fail, numel = scan.max_abs, scan.max_rel, scan.mismatches, scan.numel
    stats = {
        "max_abs": max_abs,
        "max_rel": max_rel,
        "mismatches": n_fail,
        "numel": numel,
        "matched_ratio": 1.0 - n_fail / numel,
    }
    if held.scaled:
        stats["held_atol"] = atol
    if error_cap is not None and max_abs > error_cap:
        worst_where = _index(scan.worst_abs.index, shape)
        return _fail(
            "INCORRECT_NUMERICAL",
            f"{name}: max abs error {max_abs:.3g} at {worst_where} exceeds the workload's "
            f"max_error_cap={error_cap:g} (SOL-ExecBench's tolerance spec)",
            **stats,
        )
    if n_fail == 0:
        return {"ok": True, "status": "PASSED", **stats}
    if 1.0 - n_fail / numel >= matched_ratio:
        verdict = _within_ratio(scan, shape, name, matched_ratio, stats, held)
        if verdict is not None:
            return verdict
    first = scan.first_fail
    where = _index(first.index, shape)
    worst_where = _index(scan.worst_fail.index, shape)
    allowance = math.floor((1.0 - matched_ratio) * numel + 1e-9)
    parts = [
        f"{name}: {n_fail} of {numel} elements outside atol={atol:g}{held.note()} rtol={rtol:g}"
        + (" (+ rtol x row RMS)" if row_scaled else "")
        + (
            f", more than the {allowance} that required_matched_ratio={matched_ratio:g} allows"
            if matched_ratio < 1.0
            else ""
        ),
        f"first at {where}: got {first.got:.6g}, expected {first.want:.6g}",
        f"max abs error {max_abs:.3g} at {worst_where}, max rel error {max_rel:.3g}",
    ]
    if scan.nan or scan.inf:
        parts.append(f"{scan.nan} NaN and {scan.inf} Inf where the reference is finite")
    return _fail("INCORRECT_NUMERICAL", "; ".join(parts), nan=scan.nan, inf=scan.inf, **stats)


def judge(
    out: torch.Tensor,
    ref: torch.Tensor,
    float64: Callable[[], torch.Tensor | None],
    atol: float,
    rtol: float,
    name: str = "output",
    **kw: Any,
) -> dict[str, Any]:
    """``compare`` as the guard decides, all in memory: against ``ref``; before a numerical
    failure of a float output stands, against the same reference evaluated in float64
    (``float64()``, run only then), the reference's gap to it flooring the held atol, or,
    where it is None (the reference runs in its own dtypes only), with the stated atol. The
    first report stands where neither passes; a pass says which in ``via``. The trusted
    worker's rounds do the same with less held at once (``TrustedRole._against_float64``)."""
    first = compare(out, ref, atol, rtol, name, **kw)
    if first["ok"] or first["status"] != "INCORRECT_NUMERICAL" or not ref.is_floating_point():
        return first
    hi = float64()
    if hi is None:
        again, via = compare(out, ref, atol, rtol, name, gap=UNKNOWN_GAP, **kw), "stated atol (no float64 reference)"
    elif hi.is_floating_point():
        gap = reference_gap(ref, hi)
        again, via = compare(out, hi, atol, rtol, name, same_dtype=False, gap=gap, **kw), "float64 reference"
    else:
        return first
    return {**again, "via": via, "reference_mismatch": first.get("message")} if again["ok"] else first


def _within_ratio(
    scan: Scan, shape: tuple[int, ...], name: str, matched_ratio: float, stats: dict[str, Any], held: HeldAtol
) -> dict[str, Any] | None:
    """Few enough elements miss for the matched ratio. None when they are rounding-sized (the
    output passes); a failure naming the check otherwise."""
    special = scan.first_special
    if special.index >= 0:
        return _fail(
            "INCORRECT_NUMERICAL",
            f"{name}: a NaN or Inf at {_index(special.index, shape)} where the reference has "
            f"{special.want:.6g}: required_matched_ratio={matched_ratio:g} "
            "lets finite rounding through, never a non-finite value (SOL-ExecBench rejects "
            "those too)",
            **stats,
        )
    worst = scan.worst_excess
    factor = worst.value
    if factor > OUTLIER_FACTOR:
        return _fail(
            "INCORRECT_NUMERICAL",
            f"{name}: KernelArc's outlier bound, stricter than SOL-ExecBench: {scan.outliers} elements "
            f"are off by more than {OUTLIER_FACTOR:g}x their allowance (worst at "
            f"{_index(worst.index, shape)}: got {worst.got:.6g}, expected "
            f"{worst.want:.6g}, {factor:.3g}x; atol {held.atol:g}{held.note()}). The {stats['mismatches']} of "
            f"{stats['numel']} elements outside tolerance are within required_matched_ratio="
            f"{matched_ratio:g}, but that ratio is for rounding: an error this size is a defect "
            "(an unmasked tail, a skipped element, a wrong index)",
            outlier_factor=factor,
            **stats,
        )
    return {"ok": True, "status": "PASSED", "within_ratio": True, "outlier_factor": factor, **stats}


def _fail(status: str, message: str, **stats: Any) -> dict[str, Any]:
    return {"ok": False, "status": status, "message": message, **stats}
