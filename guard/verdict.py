"""What the guard answers: the verdict of one candidate (pydantic, JSON-ready)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Decision = Literal["ACCEPT", "KEEP", "REVERT", "REJECT"]
TraceStatus = Literal[
    "PASSED", "INCORRECT_SHAPE", "INCORRECT_DTYPE", "INCORRECT_NUMERICAL", "RUNTIME_ERROR",
    "COMPILE_ERROR", "TIMEOUT", "REWARD_HACK",
]
Gate = Literal["screen", "build", "correctness", "benchmark"]


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
    timing: dict[str, Any] | None = None
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
    checked: dict[str, Any] = Field(default_factory=dict)
    phases_s: dict[str, float] = Field(default_factory=dict)
    device: dict[str, Any] = Field(default_factory=dict)
    notes: str | None = None
    parent: str | None = None
    # When the comparison was close: the incumbent and this candidate timed again side by side.
    paired: dict[str, Any] | None = None
    # What this candidate repeats (same code up to comments, a plan already tried).
    repeats: list[str] = Field(default_factory=list)
