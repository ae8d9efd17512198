"""Gate 5: per visible workload the latency, the speedups over eager and torch.compile, the
speed-of-light time and the SOL score (guard/scoring.py holds the formulas)."""

from __future__ import annotations

from typing import Any

from .. import scoring
from ..problems.dtypes import dtype_info
from ..problems.schema import Definition, Workload
from ..verdict import WorkloadResult


def score(
    d: Definition,
    visible: list[Workload],
    timings: dict[str, dict[str, Any]],
    baselines: dict[str, dict[str, Any]],
    ceilings: dict[str, Any],
) -> list[WorkloadResult]:
    """``timings``: workload -> {"stats", "nvml"} (the benchmark gate); ``baselines``: workload
    -> the reference's eager and compile times and FLOPs; ``ceilings``: the device's rates."""
    float_inputs = [s.dtype for s in d.inputs.values() if s.shape is not None and dtype_info(s.dtype).is_float]
    main_dtype = float_inputs[0] if float_inputs else next(iter(d.outputs.values())).dtype
    rate = scoring.flops_rate_for(main_dtype, ceilings)
    out = []
    for w in visible:
        stats = timings[w.uuid]["stats"]
        base = baselines.get(w.uuid) or {}
        axes = d.resolve_axes(w.axes)
        t = stats["median_ms"]
        eager = (base.get("eager") or {}).get("median_ms")
        comp = (base.get("compiled") or {}).get("median_ms")
        flops = d.flops(axes)
        if flops is None:
            flops = base.get("flops")
        t_sol, bound = scoring.sol_time_ms(flops, d.bytes_moved(axes), rate, ceilings["copy_bytes_per_s"])
        out.append(
            WorkloadResult(
                uuid=w.uuid,
                axes=w.axes,
                latency_ms=t,
                eager_ms=eager,
                compile_ms=comp,
                sol_ms=t_sol,
                bound=bound,
                speedup_eager=eager / t if eager else None,
                speedup_compile=comp / t if comp else None,
                sol_score=scoring.sol_score(t, t_sol, eager) if eager else None,
                sol_fraction=t_sol / t if t > 0 else None,
                rel_se=stats.get("rel_se"),
                iterations=stats.get("n"),
                timing=stats,
                nvml=timings[w.uuid].get("nvml"),
            )
        )
    return out
