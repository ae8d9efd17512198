"""SOL-ExecBench traces from the guard's verdicts: one trace per visible workload of a judged
candidate, with its status, correctness and performance (``sol_trace`` models).

How a verdict maps onto traces:

- PASSED (ACCEPT, KEEP, REVERT): each workload's trace is PASSED, its correctness the largest
  errors over the random-input rounds (``checked.errors``), its performance the measured
  latency against the reference's (PyTorch eager) on the same device. KernelArc's latency is
  the median over the timed iterations where SOL-ExecBench reports a mean; the log says so.
- REJECT: the guard judges a candidate as a whole and stops at the first defect, so every
  workload's trace carries the rejection's status (SOL-ExecBench does the same for a compile
  error or a reward hack). The log says on which workload, or on a held-out workload (whose
  shape stays hidden), and why. INCORRECT_NUMERICAL needs correctness: the failing workload
  has its measured errors; the others have none measured, said in ``correctness.extra``.

Held-out workloads never appear. The workload in a trace is the one run: on a CPU guard that
is the problem's small CPU version (``cpu-<uuid>``).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
from typing import Any

from ..candidates.solution import Solution as GuardSolution
from ..problems import tolerance as tolerance_mod
from ..problems.derive import CPU_WORKLOAD_COUNT, visible_workloads
from ..problems.problem import Problem
from ..problems.schema import Definition, Workload
from ..verdict import Verdict, WorkloadResult
from . import sol_trace as T

log = logging.getLogger(__name__)

LIBS = ("torch", "triton", "nvidia-cutlass-dsl", "cuda-tile", "tilelang")


class ExportError(ValueError):
    """A candidate that cannot be written as traces (not judged yet, unknown problem)."""


def environment(verdict: Verdict) -> T.Environment:
    """Where it was judged. The verdict does not store library versions: those are the ones
    installed where the export runs, which the log of each trace says."""
    name = verdict.device.name or verdict.device.kind or "unknown"
    libs = {}
    for lib in LIBS:
        try:
            libs[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            continue
    return T.Environment(hardware=name.replace(" ", "_"), libs=libs)


def trace_workload(w: Workload, axes: dict[str, int] | None = None) -> T.TraceWorkload:
    inputs = {
        k: v.model_dump(mode="json", include={"type", "value", "path", "tensor_key"}) for k, v in w.inputs.items()
    }
    tol = w.tolerance.model_dump(include=set(T.ToleranceSpec.model_fields)) if w.tolerance else {}
    # validated into the trace schema's own input and tolerance models
    return T.TraceWorkload.model_validate(
        {"uuid": w.uuid, "axes": dict(axes if axes is not None else w.axes), "inputs": inputs, "tolerance": tol}
    )


def _tolerances(d: Definition, w: Workload) -> dict[str, Any]:
    """What each output was judged by (KernelArc's own, which can be stricter than the
    workload's published spec: ``guard/problems/tolerance.py``)."""
    return {
        k: {f: v for f, v in t.message().items() if v is not None} for k, t in tolerance_mod.for_workload(d, w).items()
    }


def _timestamp(finished_at: float | None) -> str:
    when = datetime.datetime.fromtimestamp(finished_at or 0.0, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _correctness(
    errors: dict[str, Any] | None, tolerances: dict[str, Any], measured_note: str | None = None
) -> T.Correctness:
    extra: dict[str, Any] = {"kernelarc_tolerance": tolerances}
    if not errors:
        extra["measured"] = False
        if measured_note:
            extra["note"] = measured_note
        return T.Correctness(extra=extra)
    if errors.get("mismatches"):
        extra["elements_outside_tolerance"] = errors["mismatches"]
    return T.Correctness(
        max_absolute_error=float(errors.get("max_abs", 0.0)),
        max_relative_error=float(errors.get("max_rel", 0.0)),
        has_nan=bool(errors.get("has_nan", False)),
        has_inf=bool(errors.get("has_inf", False)) and not errors.get("has_nan"),
        extra=extra,
    )


def _performance(r: WorkloadResult) -> T.Performance:
    lat = r.latency_ms or 0.0
    ref = r.eager_ms or 0.0
    return T.Performance(
        latency_ms=lat, reference_latency_ms=ref, speedup_factor=(ref / lat) if lat > 0 and ref > 0 else 0.0
    )


def candidate_traces(
    verdict: Verdict,
    problem: Problem,
    solution_name: str,
    finished_at: float | None = None,
    cpu_count: int = CPU_WORKLOAD_COUNT,
) -> list[T.Trace]:
    """The traces of one judged candidate, one per visible workload (on a CPU ``cpu_count`` at
    most, as the workspace's guard judges them), in the problem's order."""
    d = problem.definition
    env = environment(verdict)
    stamp = _timestamp(finished_at)
    workloads = visible_workloads(problem, verdict.device.kind or "cpu", cpu_count)
    errors = verdict.checked.errors or {}
    traces = []
    if verdict.status == "PASSED":
        by_uuid = {w.uuid: w for w in workloads}
        for r in verdict.workloads:
            w = by_uuid.get(r.uuid)
            if w is None or r.latency_ms is None:
                log.warning(
                    "%s: workload %s is not among the problem's now, or has no timing; left out",
                    verdict.candidate_id,
                    r.uuid,
                )
                continue
            tols = _tolerances(d, w)
            timing = r.timing.method if r.timing and r.timing.method else "unknown"
            ev = T.Evaluation(
                status="PASSED",
                environment=env,
                timestamp=stamp,
                log=(
                    f"KernelArc {verdict.decision}: latency is the median over {r.iterations or '?'} "
                    f"timed iterations ({timing}); reference is PyTorch eager on the same device"
                ),
                correctness=_correctness(errors.get(w.uuid), tols),
                performance=_performance(r),
            )
            traces.append(
                T.Trace(
                    definition=d.name, solution=solution_name, evaluation=ev, workload=trace_workload(w, r.axes or None)
                )
            )
        return traces
    for w in workloads:
        tols = _tolerances(d, w)
        here = verdict.first_failing_workload == w.uuid
        if here:
            where = "on this workload"
        elif verdict.first_failing_workload and verdict.first_failing_workload.startswith("held-out"):
            where = f"on a {verdict.first_failing_workload} (shape not shown)"
        elif verdict.first_failing_workload:
            where = f"on workload {verdict.first_failing_workload}"
        else:
            where = f"at the {verdict.gate or 'first'} gate, before any workload ran"
        text = f"KernelArc REJECT {where}: {verdict.reason}"
        correctness = None
        if verdict.status == "INCORRECT_NUMERICAL":
            correctness = _correctness(
                errors.get(w.uuid) if here else None,
                tols,
                None if here else f"not measured here: the candidate failed {where}",
            )
        ev = T.Evaluation(status=verdict.status, environment=env, timestamp=stamp, log=text, correctness=correctness)
        traces.append(T.Trace(definition=d.name, solution=solution_name, workload=trace_workload(w), evaluation=ev))
    return traces


def stored_solution(solution_json: str) -> GuardSolution:
    return GuardSolution.model_validate_json(solution_json)
