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
  that miss are judged per call, and counted over all the calls checked together
  (``SampleTally``): each call's positions are drawn anew (``replays.Projection``), so an
  honest kernel whose few misses sit at fixed places (the last column, a tile's edge) misses
  at new samples on every call, and the count over the calls is a binomial one.

Both also accept what matches the reference evaluated in float64 (a kernel more accurate than
a reference that rounds intermediates); ``exact`` runs it, only when it is needed, and at most
once per call (the caller passes it cached). Both hold the atol down to the reference's size
(``held_atol``), against the float64 reference with the floors the reference's own gap to it
gives; where the float64 reference cannot run, the stated atol decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from . import messages as m
from . import replays
from .compare import judge, spec_args
from .held_atol import NO_GAP, UNKNOWN_GAP, reference_gap, resolution
from .tensorio import read_tensor

# the float64 reference's outputs, or None where it cannot run
Exact = Callable[[], list[torch.Tensor] | None]


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
        exact_j = functools.partial(_nth, exact, j)
        report = judge(out, ref, exact_j, tol.atol, tol.rtol, name, figures=False, **spec_args(tol.model_dump()))
        if not report["ok"]:
            message: str = report["message"]
            return message
    return None


def _nth(exact: Exact, j: int) -> torch.Tensor | None:
    outputs = exact()
    return None if outputs is None else outputs[j]


class SampleTally:
    """The sampled elements that missed their tolerance, per output and call, over every call
    checked in one request: a result that misses more often than its matched ratio allows can
    stay within the per-call allowance (9 of 64 at 0.99) call after call, not over all of them
    (34 of 1024 for 16 calls). Sound only because every call's positions are new draws."""

    def __init__(self, outputs: int):
        self.misses: list[dict[int, int]] = [{} for _ in range(outputs)]  # per output: iteration -> misses

    def add(self, j: int, misses: int, iteration: int) -> None:
        self.misses[j][iteration] = misses

    def lower(self, j: int, misses: int, iteration: int) -> None:
        """Fewer misses for that call: held to the reference evaluated in float64, which a
        kernel more accurate than a reference that rounds its intermediates matches better."""
        if iteration in self.misses[j]:
            self.misses[j][iteration] = min(self.misses[j][iteration], misses)

    def mismatch(self, tolerances: list[m.Tolerance], names: list[str]) -> tuple[int, str] | None:
        """(the call with the most misses, why) when an output's misses over all calls are
        more than its ratio lets pass, else None."""
        for by_call, tol, name in zip(self.misses, tolerances, names):
            ratio = tol.required_matched_ratio or 1.0
            samples = len(by_call) * m.DIGEST_SAMPLES
            allowed = replays.misses_allowed(samples, ratio)
            total = sum(by_call.values())
            if total > allowed:
                worst = max(by_call, key=by_call.__getitem__)
                return worst, (
                    f"output {name!r}: {total} of {samples} sampled elements over {len(by_call)} "
                    f"calls outside the tolerance, where required_matched_ratio={ratio:g} lets {allowed} pass"
                )
        return None


def _second_bounds(
    ref: torch.Tensor,
    hi: torch.Tensor | None,
    tol: m.Tolerance,
    projection: replays.Projection,
    iteration: int,
) -> tuple[list[float], list[float]] | None:
    """The digest bounds a float output is held to before a failure stands (``compare.judge``
    for digests): the float64 reference's, the reference's gap to it flooring the held atol,
    or, where there is none (``hi`` None), the reference's with the stated atol; None where the
    float64 output is not a float."""
    ratio, cap = tol.required_matched_ratio or 1.0, tol.max_error_cap
    if hi is None:
        return replays.digest_bounds(ref, tol.atol, tol.rtol, projection, ratio, cap, iteration, UNKNOWN_GAP)
    if not hi.is_floating_point():
        return None
    hi = hi.to(torch.float64)
    gap, spacing = reference_gap(ref, hi), resolution(ref.dtype)
    return replays.digest_bounds(hi, tol.atol, tol.rtol, projection, ratio, cap, iteration, gap, spacing)


def lower_by_exact(
    tally: SampleTally,
    row: list[list[float]],
    refs: list[torch.Tensor],
    exact: list[torch.Tensor] | None,
    tolerances: list[m.Tolerance],
    projection: replays.Projection,
    iteration: int,
) -> None:
    """Count call ``iteration``'s sampled misses as its own check holds them before it
    accuses (``_second_bounds``), and keep the fewer (``SampleTally.lower``): before the count
    over the calls accuses a kernel, as each call's own check does before it accuses one."""
    for j, (got, ref, tol) in enumerate(zip(row, refs, tolerances)):
        bounds = _second_bounds(ref, None if exact is None else exact[j], tol, projection, iteration)
        if ref.is_floating_point() and bounds is not None:
            tally.lower(j, replays.compare_samples(got, *bounds).misses, iteration)


def digests_mismatch(
    row: list[list[float]],
    refs: list[torch.Tensor],
    tolerances: list[m.Tolerance],
    names: list[str],
    projection: replays.Projection,
    exact: Exact,
    iteration: int,
    tally: SampleTally | None = None,
) -> str | None:
    """Why call ``iteration``'s digests cannot come from a result within tolerance, or None;
    its sampled elements that missed are added to ``tally``."""
    if len(row) != len(refs):
        return f"{len(row)} outputs digested, expected {len(refs)}"
    for j, (got, ref, tol, name) in enumerate(zip(row, refs, tolerances, names)):
        ratio, cap = tol.required_matched_ratio or 1.0, tol.max_error_cap
        spacing = resolution(ref.dtype)
        values, allow = replays.digest_bounds(
            ref, tol.atol, tol.rtol, projection, ratio, cap, iteration, NO_GAP, spacing
        )
        why = replays.digest_mismatch(got, values, allow, name, ratio)
        if why and ref.is_floating_point():
            bounds = _second_bounds(ref, _nth(exact, j), tol, projection, iteration)
            if bounds is not None and replays.digest_mismatch(got, *bounds, name, ratio) is None:
                why, (values, allow) = None, bounds
        if why:
            return why
        if tally is not None:
            tally.add(j, replays.compare_samples(got, values, allow).misses, iteration)
    return None
