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
scale of its rounding:

- the reference's own error: where the reference, rounded in its dtypes, lies far from the
  same reference evaluated in float64 (an output that cancels to near zero: the mean of a
  normalised tensor, a difference of near-equal terms), the bound is at least
  ``REFERENCE_ERROR_FACTOR`` times the largest such error. The checks know it only once the
  float64 reference has run, which they do before they accuse (``reference_error``);
- a reference that is zero throughout (nothing to scale to) keeps the stated atol.

A tolerance without a relative part (``rtol`` 0) is absolute by intent and is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .messages import DEFAULT_CHUNK_ELEMENTS

SCALE_FACTOR = 10.0
REFERENCE_ERROR_FACTOR = 10.0


@dataclass(frozen=True)
class HeldAtol:
    """The atol an output's elements are held to, and what made it."""

    atol: float
    stated: float
    rms: float
    reference_error: float = 0.0

    @property
    def scaled(self) -> bool:
        return self.atol < self.stated

    def note(self) -> str:
        """How the bound was set, for a failure's message ('' when it is the stated one)."""
        if not self.scaled:
            return ""
        why = f"scaled from {self.stated:g}: {SCALE_FACTOR:g} x rtol x the reference's RMS {self.rms:.3g}"
        if self.reference_error > 0:
            why += f", at least {REFERENCE_ERROR_FACTOR:g} x the reference's own error {self.reference_error:.3g}"
        return f" ({why})"


def held_atol(stated: float, rtol: float, rms: float, reference_error: float = 0.0) -> HeldAtol:
    """The atol for a reference of root mean square ``rms`` whose largest error against its
    float64 evaluation is ``reference_error`` (0 where unknown)."""
    if rtol <= 0 or stated <= 0 or not math.isfinite(rms) or rms <= 0:
        return HeldAtol(stated, stated, rms, reference_error)
    floor = REFERENCE_ERROR_FACTOR * reference_error
    return HeldAtol(min(stated, max(SCALE_FACTOR * rtol * rms, floor)), stated, rms, reference_error)


def rms(t: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> float:
    """The root mean square of ``t``'s finite elements, in float64, a chunk at a time (0 for
    none). A complex tensor counts its real and imaginary parts as elements."""
    x = torch.view_as_real(t) if t.is_complex() else t
    flat = x.reshape(-1)
    total, count = 0.0, 0
    step = max(1, int(chunk_elements))
    for start in range(0, flat.numel(), step):
        y = flat[start : start + step].to(torch.float64)
        finite = torch.isfinite(y)
        figures = torch.stack([torch.where(finite, y, 0.0).pow(2).sum(), finite.sum().to(torch.float64)]).tolist()
        total += figures[0]
        count += int(figures[1])
    return math.sqrt(total / count) if count else 0.0


def reference_error(ref: torch.Tensor, exact: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> float:
    """The largest ``|ref - exact|`` where both are finite: how far the reference, rounded in
    its own dtypes, lies from its float64 evaluation on the same inputs."""
    a = (torch.view_as_real(ref) if ref.is_complex() else ref).reshape(-1)
    b = (torch.view_as_real(exact) if exact.is_complex() else exact).reshape(-1)
    if a.numel() != b.numel():
        return 0.0
    worst = 0.0
    step = max(1, int(chunk_elements))
    for start in range(0, a.numel(), step):
        x = a[start : start + step].to(torch.float64)
        y = b[start : start + step].to(device=x.device, dtype=torch.float64)
        both = torch.isfinite(x) & torch.isfinite(y)
        worst = max(worst, float(torch.where(both, (x - y).abs(), 0.0).max().item()))
    return worst
