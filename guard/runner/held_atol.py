"""The absolute tolerance an output is held to: the stated one, scaled down to the
reference's own size where the outputs are far smaller than it.

``|out - ref| <= atol + rtol * |ref|`` says nothing about elements far below ``atol``: a
softmax over a large vocabulary (outputs near 1/V), a vector divided by its norm, attention
outputs at long contexts, every output of a "tiny" round. Zeros, or an answer scaled by 0.9,
were within tolerance there (the audit of session 37, docs/guard.md). So an output is held to
at most ``SCALE_FACTOR * rtol * RMS(reference)``: where the reference's root mean square is
``atol / (SCALE_FACTOR * rtol)`` or more (0.1 at the default tolerances) nothing changes, and
below it the bound becomes relative to the output's own size.

Two floors keep an honest kernel from being accused where the output's size is not the
scale of its rounding. Both use how far the reference, rounded in its dtypes, lies from the
same reference evaluated in float64 (its ``ReferenceGap``), which the checks know only once
the float64 reference has run, as they do before they accuse:

- where that gap's RMS is ``NOISE_SHARE`` of the float64 output's RMS or more, the output is
  mostly rounding (KernelBench level 2's 23_Conv3d_GroupNorm_Mean is 0 in exact arithmetic):
  nothing can be held to its size, and the stated atol stands. A red-team review found
  honest kernels there 5-40x further from float64 than ATen's cascade sums (session 38);
- elsewhere the atol is at least ``REFERENCE_ERROR_FACTOR`` times the gap's largest element
  (an output that cancels partly, a norm whose float32 reference itself misses rtol).

A reference that is zero throughout (nothing to scale to) and a tolerance without a relative
part (``rtol`` 0, absolute by intent) keep the stated atol too, and the atol is never below
``RESOLUTION_STEPS`` of the output dtype's own spacing near zero (``resolution``): a float16
"tiny" round's outputs are subnormal, and two honest orders of operations differ there by a
step of 6e-8 (a review, session 38).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .messages import DEFAULT_CHUNK_ELEMENTS

SCALE_FACTOR = 10.0
REFERENCE_ERROR_FACTOR = 10.0
NOISE_SHARE = 0.1
RESOLUTION_STEPS = 2.0


def resolution(dtype: torch.dtype) -> float:
    """``RESOLUTION_STEPS`` times the spacing of ``dtype``'s values near zero (its smallest
    subnormal); 0 for a dtype that is not a float."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    return RESOLUTION_STEPS * info.smallest_normal * info.eps


@dataclass(frozen=True)
class ReferenceGap:
    """How far the reference, rounded in its own dtypes, lies from its float64 evaluation on
    the same inputs: the largest element's difference and the differences' RMS."""

    largest: float = 0.0
    rms: float = 0.0


NO_GAP = ReferenceGap()  # not known yet: the float64 reference has not run
# the reference refuses float64 itself (its own dtypes only): nothing sizes the output beyond
# its rounding, and the stated atol stands. A float64 run that fails for the device's state
# never leads here (``reference_failures``)
UNKNOWN_GAP = ReferenceGap(math.inf, math.inf)


@dataclass(frozen=True)
class HeldAtol:
    """The atol an output's elements are held to, and what made it."""

    atol: float
    stated: float
    rms: float
    gap: ReferenceGap = NO_GAP

    @property
    def scaled(self) -> bool:
        return self.atol < self.stated

    def note(self) -> str:
        """How the bound was set, for a failure's message ('' when it is the stated one)."""
        if not self.scaled:
            return ""
        why = f"scaled from {self.stated:g}: {SCALE_FACTOR:g} x rtol x the reference's RMS {self.rms:.3g}"
        if self.gap.largest > 0:
            why += f", at least {REFERENCE_ERROR_FACTOR:g} x the reference's own error {self.gap.largest:.3g}"
        return f" ({why})"


def held_atol(stated: float, rtol: float, rms: float, gap: ReferenceGap = NO_GAP, spacing: float = 0.0) -> HeldAtol:
    """The atol for a reference of root mean square ``rms`` (the float64 one's, where ``gap``
    is known) that lies ``gap`` from its float64 evaluation, of an output whose dtype's
    ``resolution`` is ``spacing``."""
    if rtol <= 0 or stated <= 0 or not math.isfinite(rms) or rms <= 0 or gap.rms >= NOISE_SHARE * rms:
        return HeldAtol(stated, stated, rms, gap)
    floor = max(REFERENCE_ERROR_FACTOR * gap.largest, spacing)
    return HeldAtol(min(stated, max(SCALE_FACTOR * rtol * rms, floor)), stated, rms, gap)


def _flat_real(t: torch.Tensor) -> torch.Tensor:
    return (torch.view_as_real(t) if t.is_complex() else t).reshape(-1)


def rms(t: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> float:
    """The root mean square of ``t``'s finite elements, in float64, a chunk at a time (0 for
    none). A complex tensor counts its real and imaginary parts as elements."""
    flat = _flat_real(t)
    total, count = 0.0, 0
    step = max(1, int(chunk_elements))
    for start in range(0, flat.numel(), step):
        y = flat[start : start + step].to(torch.float64)
        finite = torch.isfinite(y)
        figures = torch.stack([torch.where(finite, y, 0.0).pow(2).sum(), finite.sum().to(torch.float64)]).tolist()
        total += figures[0]
        count += int(figures[1])
    return math.sqrt(total / count) if count else 0.0


def reference_gap(ref: torch.Tensor, exact: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> ReferenceGap:
    """``ReferenceGap`` of ``ref`` from ``exact`` over the elements finite in both, a chunk at
    a time."""
    a, b = _flat_real(ref), _flat_real(exact)
    if a.numel() != b.numel():
        return NO_GAP
    largest, total, count = 0.0, 0.0, 0
    step = max(1, int(chunk_elements))
    for start in range(0, a.numel(), step):
        x = a[start : start + step].to(torch.float64)
        y = b[start : start + step].to(device=x.device, dtype=torch.float64)
        both = torch.isfinite(x) & torch.isfinite(y)
        d = torch.where(both, (x - y).abs(), 0.0)
        figures = torch.stack([d.max(), d.pow(2).sum(), both.sum().to(torch.float64)]).tolist()
        largest = max(largest, figures[0])
        total += figures[1]
        count += int(figures[2])
    return ReferenceGap(largest, math.sqrt(total / count) if count else 0.0)
