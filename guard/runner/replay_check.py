"""How the trusted worker judges one timed call that the guard chose to check (``VerifyReplays``).

The reference has run on the call's own inputs; what the call left is held to it in one of
two ways:

- ``outputs_mismatch``: the outputs themselves, as the guard read them out of the stopped
  candidate's memory (a CPU loop). They are compared element by element, exactly as a
  correctness round is (``compare``): a result that approximates the answer on timed calls
  only fails here as it would in a round.
- ``digests_mismatch``: the digests the candidate's process took of them (a GPU loop, whose
  outputs the guard cannot read): sums and norms, which tell a skipped, remembered or stale
  call from a computed one, and a sample of elements held to the tolerance itself, which an
  approximation off on many elements fails (see docs/guard.md, threat model). The samples
  are judged call by call only: their positions are the same for every call of a run, so
  counting their misses over the calls as if they were new draws would accuse an honest
  kernel whose few misses sit at fixed places (the last column, a tile's edge).

Both also accept what matches the reference evaluated in float64 (a kernel more accurate than
a reference that rounds intermediates); ``exact`` runs it, only when it is needed, and at most
once per call (the caller passes it cached).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import messages as m
from . import replays
from .compare import compare, spec_args
from .tensorio import read_tensor

Exact = Callable[[], list[torch.Tensor]]


def read_output(r: m.ReadOutput) -> torch.Tensor:
    """An output read out of the candidate's memory: its storage span as a file, viewed with
    the shape and strides it had there."""
    flat = read_tensor({"file": r.file, "shape": [r.span], "dtype": r.dtype}, "cpu")
    return flat.as_strided(r.shape, r.stride) if r.span else flat.new_empty(r.shape)


def outputs_mismatch(
    row: list[m.ReadOutput | None],
    refs: list[torch.Tensor],
    tolerances: list[m.Tolerance],
    names: list[str],
    exact: Exact,
) -> str | None:
    """Why one call's outputs, as read, are not the reference's within tolerance, or None."""
    if len(row) != len(refs):
        return f"{len(row)} outputs read, expected {len(refs)}"
    for j, (r, ref, tol, name) in enumerate(zip(row, refs, tolerances, names)):
        if r is None:
            return f"output {name!r}: not a tensor"
        out = read_output(r)
        args = spec_args(tol.model_dump())
        report = compare(out, ref, tol.atol, tol.rtol, name, figures=False, **args)
        if report["ok"]:
            continue
        if report["status"] == "INCORRECT_NUMERICAL" and ref.is_floating_point():
            hi = exact()[j]
            if (
                hi.is_floating_point()
                and compare(out, hi, tol.atol, tol.rtol, name, same_dtype=False, figures=False, **args)["ok"]
            ):
                continue
        message: str = report["message"]
        return message
    return None


def digests_mismatch(
    row: list[list[float]],
    refs: list[torch.Tensor],
    tolerances: list[m.Tolerance],
    names: list[str],
    projection: replays.Projection,
    exact: Exact,
) -> str | None:
    """Why one call's digests cannot come from a result within tolerance, or None."""
    if len(row) != len(refs):
        return f"{len(row)} outputs digested, expected {len(refs)}"
    for j, (got, ref, tol, name) in enumerate(zip(row, refs, tolerances, names)):
        ratio, cap = tol.required_matched_ratio or 1.0, tol.max_error_cap
        values, allow = replays.digest_bounds(ref, tol.atol, tol.rtol, projection, ratio, cap)
        why = replays.digest_mismatch(got, values, allow, name, ratio)
        if why and ref.is_floating_point():
            hi = exact()[j].to(torch.float64)
            hi_values, hi_allow = replays.digest_bounds(hi, tol.atol, tol.rtol, projection, ratio, cap)
            if replays.digest_mismatch(got, hi_values, hi_allow, name, ratio) is None:
                why, values, allow = None, hi_values, hi_allow
        if why:
            return why
    return None
