"""What the guard answers: the verdict of one candidate (pydantic, JSON-ready).

Verdicts are stored as JSON (``candidates.verdict_json``) and read back, so every verdict
written by an earlier version must still load and dump to the same JSON
(tests/data/verdicts). The parts below that were plain dicts (timing, checks, device,
paired re-measurement) are typed now, but keep that shape: all their fields are optional,
and a part gives back only the keys it was given (a timing method's own fields, the
ceilings once measured, fields added since)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from .outside_clock import OutsideClock

Decision = Literal["ACCEPT", "KEEP", "REVERT", "REJECT"]
TraceStatus = Literal[
    "PASSED",
    "INCORRECT_SHAPE",
    "INCORRECT_DTYPE",
    "INCORRECT_NUMERICAL",
    "RUNTIME_ERROR",
    "COMPILE_ERROR",
    "TIMEOUT",
    "REWARD_HACK",
]
# "pairing": the challenger failed while timed again side by side with an incumbent
Gate = Literal["screen", "build", "correctness", "benchmark", "pairing"]


class _Part(BaseModel):
    """A part of a verdict that gives back only the keys it was given, so that a stored
    verdict dumps to the JSON it was loaded from (no null for a field it never had)."""

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        given = self.model_fields_set | set(self.__pydantic_extra__ or ())
        return {k: v for k, v in data.items() if k in given}


class Timing(_Part):
    """One workload's timing (guard/runner/timing.py: ``summarize`` and ``Timer.measure``).
    Each method gives its own fields; fields this model does not name are kept."""

    model_config = ConfigDict(extra="allow")

    median_ms: float | None = None  # the latency, over ``n`` timed iterations
    mean_ms: float | None = None
    min_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    iqr_ms: float | None = None
    n: int | None = None
    rel_se: float | None = None  # standard error of the median, relative to it
    event_median_ms: float | None = None  # the CUDA events' own times (the span is the latency)
    host_median_ms: float | None = None  # cuda-events+host-sync, host-clock
    sync_overhead_ms: float | None = None
    method: str | None = None  # cuda-graph+cupti, cuda-graph, cuda-events+cupti, cuda-events+host-sync, host-clock
    call_host_median_ms: float | None = None  # eager: host time inside the call
    outside_clock: OutsideClock | None = None  # the guard's own clock's check of this figure
    n_sets: int | None = None  # input sets rotated over
    flush_bytes: int | None = None  # cache flush before every iteration
    warmup_iters: int | None = None
    planned_iters: int | None = None
    eager_warmup_median_ms: float | None = None
    loop_warmup_median_ms: float | None = None  # fresh inputs and flush before each call
    off_stream_suspect: bool | None = None  # host time well above event time: work off the event window
    cupti_error: str | None = None  # why CUPTI gave no usable record (cuda-graph)
    graph_error: str | None = None  # why the call could not be captured in a graph
    device_ops_per_call: float | None = None  # kernels, copies and memsets of one call
    event_mean_ms: float | None = None
    iters_run: int | None = None  # eager loops may stop early at their time limit
    flush_ms: float | None = None  # one flush pass, as the candidate's worker measured it
    pad_ms: float | None = None  # idle device time before each timed call


class Checked(_Part):
    """What the correctness gate ran (empty when it did not pass)."""

    visible_workloads: int | None = None
    heldout_workloads: int | None = None
    rounds: int | None = None
    rounds_skipped: int | None = None
    determinism: bool | None = None
    # per visible workload: the largest errors over its rounds (max_abs, max_rel; mismatches when
    # elements were let through by the matched ratio; has_nan), for SOL-ExecBench traces
    errors: dict[str, dict[str, Any]] | None = None


class DeviceInfo(_Part):
    """Where the candidate was judged."""

    kind: str | None = None  # "cuda" or "cpu"
    key: str | None = None  # the physical device (where measurements were taken)
    group: str | None = None  # the devices whose measurements are comparable (absent before groups)
    name: str | None = None
    ceilings: dict[str, Any] | None = None  # the device's rates, once measured
    isolation: str | None = None  # how candidate workers are isolated


class PairedWorkload(_Part):
    """One workload's side-by-side medians, in the order they were taken."""

    incumbent_ms: list[float] = Field(default_factory=list)
    challenger_ms: list[float] = Field(default_factory=list)


class PairedEntry(_Part):
    """A paired re-measurement against one incumbent."""

    incumbent: str | None = None  # the incumbent's candidate id
    stored_speedup: float | None = None  # the comparison with its stored figures
    why: str | None = None  # why it was re-measured (absent before device groups)
    paired_speedup: float | None = None  # None when the incumbent could not be timed again
    threshold: float | None = None
    note: str | None = None  # why not, then
    # the incumbent's paired figures over what its own record allows (1: as its record says);
    # beyond the pairing's noise the re-measurement decided nothing (``note`` says so)
    incumbent_slowdown: float | None = None
    inconclusive: bool | None = None
    workloads: dict[str, PairedWorkload] = Field(default_factory=dict)


# "agent": against the agent's best; "global": against the global best
PairedLabel = Literal["agent", "global"]


class WorkloadResult(BaseModel):
    uuid: str
    axes: dict[str, int] = Field(default_factory=dict)
    latency_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    sol_ms: float | None = None
    bound: str | None = None  # "memory" or "compute": the larger of the two SOL terms
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    sol_score: float | None = None
    sol_fraction: float | None = None  # T_sol / T
    rel_se: float | None = None
    iterations: int | None = None
    timing: Timing | None = None
    nvml: dict[str, Any] | None = None


class Advice(BaseModel):
    action: Literal["continue", "redraft", "stop"]
    message: str
    attempts: int = 0
    non_improving: int = 0
    tried: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    candidate_id: str
    problem: str
    agent: str
    decision: Decision
    status: TraceStatus
    gate: Gate | None = None
    reason: str
    diagnostic: str | None = None
    first_failing_workload: str | None = None
    score: float | None = None  # mean SOL score over the visible workloads
    speedup_eager: float | None = None  # geometric mean over workloads
    speedup_compile: float | None = None
    sol_fraction: float | None = None
    latency_ms: float | None = None  # geometric mean over workloads
    speedup_vs_best: float | None = None
    threshold: float | None = None
    agent_best_id: str | None = None
    global_best_id: str | None = None
    is_global_best: bool = False
    duplicate_of: str | None = None
    advice: Advice
    workloads: list[WorkloadResult] = Field(default_factory=list)
    checked: Checked = Field(default_factory=Checked)
    phases_s: dict[str, float] = Field(default_factory=dict)
    # the workers' peak memory during this evaluation ("trusted", "candidate"; device memory on
    # a GPU, resident memory on the CPU); absent on verdicts from before it was measured
    peak_memory_bytes: dict[str, int] | None = None
    # the same per gate ("build", "correctness", "benchmark", "pairing"): which work held the most
    peak_memory_by_gate: dict[str, dict[str, int]] | None = None
    device: DeviceInfo = Field(default_factory=DeviceInfo)
    notes: str | None = None
    parent: str | None = None
    # When the comparison was close: the incumbent and this candidate timed again side by side.
    paired: dict[PairedLabel, PairedEntry] | None = None
    # What this candidate repeats (same code up to comments, a plan already tried).
    repeats: list[str] = Field(default_factory=list)
