"""Tail probabilities for the decision's thresholds.

``noise_sigmas`` says how sure an ACCEPT must be in the language of a normal distribution:
3 standard errors is a one-sided false-alarm rate of 0.135%. That holds when the standard
error is known. A paired re-measurement estimates it from a few repetitions (two per
workload), and on a busy machine such an estimate is often far too small by chance; the
same false-alarm rate then needs Student's t with the estimate's degrees of freedom
(``t_multiplier``): 6.6 standard errors at 4 degrees of freedom instead of 3, 3.5 at 16.
"""

from __future__ import annotations

import math


def normal_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (t >= 0)."""
    if math.isinf(df):
        return normal_tail(t)
    return 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_multiplier(sigmas: float, df: float) -> float:
    """The multiple of an estimated standard error (``df`` degrees of freedom) with the same
    one-sided tail probability as ``sigmas`` known standard errors."""
    if sigmas <= 0 or df > 1e6 or math.isinf(df):
        return sigmas
    target = normal_tail(sigmas)
    lo, hi = sigmas, sigmas
    while t_tail(hi, df) > target:  # widen until the tail is small enough
        hi *= 2.0
        if hi > 1e9:
            return hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_tail(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9 * hi:
            break
    return hi
