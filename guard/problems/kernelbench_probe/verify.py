"""The generated reference run once on the CPU, as the guard would run it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..kernelbench_import import CPU_RUN_LIMIT_S
from .failures import failure_reason, time_limit

if TYPE_CHECKING:
    from ..problem import Problem


CHECK_MAX_BYTES = 1 << 30  # a CPU workload whose tensors add up to more is not run
CPU_FLOP_BUDGET = 5e8  # FLOPs (matmuls, convolutions) of one reference call at the CPU workload
MIN_ELEMENT_BUDGET = 1 << 10  # the CPU element budget is never lowered below this
CPU_FLOP_HARD_CAP = 1e10  # a CPU workload computing more is not run at import
DETERMINISM_MAX_S = 1.0  # the reference runs a second time (same inputs) when this fast


def verify_on_cpu(path: str, problem: Problem, axes: dict[str, int]) -> dict[str, Any]:
    """Run the generated reference once on the CPU at ``axes`` (resolved), as the guard
    would: ``generate_inputs`` then ``run``; compare the shapes with the definition's."""
    import torch

    d = problem.definition
    io_bytes = d.io_bytes(axes)
    if io_bytes > CHECK_MAX_BYTES:
        return {
            "ok": False,
            "phase": "size",
            "reason": f"its inputs and outputs take {io_bytes / (1 << 30):.1f} GiB, too much to run",
        }
    ns: dict[str, Any] = {"__name__": "kernelbench_reference", "__file__": path}
    t0 = time.perf_counter()
    phase = "loading the reference"
    try:
        with time_limit(CPU_RUN_LIMIT_S):
            exec(compile(d.reference, path, "exec"), ns)
            phase = "generate_inputs"
            torch.manual_seed(0)
            inputs = ns["generate_inputs"](axes, "cpu")
            phase = "run"
            torch.manual_seed(1)
            out1 = ns["run"](**inputs)
            seconds = time.perf_counter() - t0
            out2 = None
            if seconds < DETERMINISM_MAX_S:
                torch.manual_seed(2)
                out2 = ns["run"](**inputs)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return {"ok": False, "phase": phase, "reason": failure_reason(exc, path, CPU_RUN_LIMIT_S)}
    outs1 = list(out1) if isinstance(out1, (tuple, list)) else [out1]
    predicted = [list(d.shape_of(s, axes)) for s in d.outputs.values()]
    got = [list(o.shape) if isinstance(o, torch.Tensor) else None for o in outs1]
    if got != predicted:
        return {"ok": False, "phase": "shapes", "reason": f"outputs {got}, the definition says {predicted}"}
    for n, s in d.inputs.items():
        v = inputs.get(n)
        want = list(d.shape_of(s, axes)) if s.shape is not None else None
        if isinstance(v, torch.Tensor) and list(v.shape) != want:
            return {
                "ok": False,
                "phase": "shapes",
                "reason": f"input {n} is {list(v.shape)}, the definition says {want}",
            }
    result: dict[str, Any] = {
        "ok": True,
        "seconds": seconds,
        "largest_elements": max(
            [v.numel() for v in inputs.values() if isinstance(v, torch.Tensor)] + [o.numel() for o in outs1],
            default=0,
        ),
    }
    if out2 is not None:
        outs2 = list(out2) if isinstance(out2, (tuple, list)) else [out2]
        result["deterministic"] = all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(outs1, outs2))
    return result
