"""Scores from measurements: speed-of-light time and the SOL score per workload, and their
aggregates. Pure arithmetic, no I/O.

T_sol = max(FLOPs / matmul rate for the problem's dtype, bytes / copy bandwidth).
S = 1 / (1 + (T - T_sol) / (T_base - T_sol)) with T_base the eager reference: 0.5 at the
baseline, 1 at the speed of light; clipped to [0, 1]. Undefined when the baseline is not
slower than T_sol (the bound is then not informative).
"""

from __future__ import annotations

import math
from typing import Any


def sol_time_ms(flops: float | None, nbytes: float, flops_rate: float | None, bandwidth: float) -> tuple[float, str]:
    t_mem = nbytes / bandwidth * 1e3 if bandwidth > 0 else 0.0
    t_cmp = flops / flops_rate * 1e3 if flops and flops_rate else 0.0
    return (max(t_mem, t_cmp), "compute" if t_cmp > t_mem else "memory")


def sol_score(t: float, t_sol: float, t_base: float) -> float | None:
    if t_base is None or t_sol is None or t <= 0 or t_base <= t_sol:
        return None
    s = 1.0 / (1.0 + (t - t_sol) / (t_base - t_sol))
    return min(1.0, max(0.0, s))


def geomean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def flops_rate_for(dtype: str, ceilings: dict[str, Any]) -> float | None:
    rates: dict[str, float | None] = ceilings.get("matmul_flops_per_s", {})
    if dtype in rates and rates[dtype]:
        return rates[dtype]
    return rates.get("float32")
