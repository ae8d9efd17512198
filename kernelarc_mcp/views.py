"""What the tools return: pydantic models, so MCP clients get structured output with a
schema. Held-out workloads never appear in any of them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from guard.verdict import Verdict


class ProblemSummary(BaseModel):
    name: str
    origin: str = Field(description="seed (shipped) or workspace (imported)")
    op_family: str
    workloads: int
    dtypes: list[str]
    description: str = ""
    seed_kernels: list[str] = Field(default_factory=list)


class ProblemList(BaseModel):
    problems: list[ProblemSummary]
    device: str = Field(description="where this server evaluates candidates")


class WorkloadView(BaseModel):
    uuid: str
    axes: dict[str, int] = Field(description="values of the var axes")
    eager_ms: float | None = Field(None, description="reference (PyTorch eager) latency, once measured")
    compile_ms: float | None = Field(None, description="torch.compile latency, once measured")
    sol_ms: float | None = Field(None, description="speed-of-light time from FLOPs/bytes and the device ceilings")
    bound: str | None = None


class ProblemView(BaseModel):
    name: str
    description: str | None = None
    op_type: str | None = None
    op_family: str
    axes: dict[str, Any]
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    reference: str = Field(description="the PyTorch reference; your run(...) must match its signature")
    tolerances: dict[str, dict[str, float]] = Field(
        description="atol/rtol per output, and the share of elements that must be within them; "
        "atol is at most 10 x rtol x the reference output's root mean square, unless that output is "
        "mostly rounding"
    )
    not_honoured: list[str] = Field(
        default_factory=list,
        description="fields of the SOL-ExecBench schema "
        "this problem uses that KernelArc does not honour as SOL-ExecBench does",
    )
    flops_formula: str | None = None
    bytes_formula: str | None = None
    workloads: list[WorkloadView] = Field(description="the visible workloads timed on this server's device")
    heldout_workloads: int = Field(description="how many hidden workloads are also checked (never shown)")
    seed_files: list[str] = Field(default_factory=list, description="the shipped seed kernels' file names")
    seed_kernels: dict[str, str] = Field(
        default_factory=dict, description="file name -> source of the shipped seed kernels (with detail='full')"
    )
    device: str
    contract: str


class SubmitResult(BaseModel):
    state: Literal["done", "queued", "running", "error", "interrupted", "cancelled"] = Field(
        description="interrupted, cancelled: the server stopped before a verdict (message says why); resubmit"
    )
    job_id: str
    candidate_id: str | None = None
    verdict: Verdict | None = Field(
        None,
        description="the verdict: its decision, reason, advice and per-workload "
        "figures (detail='full': also timing internals, device, phases)",
    )
    message: str = Field("", description="what happened, in words (left out when the verdict says it)")
    position: int | None = Field(None, description="evaluations ahead of this one")
    progress: dict[str, Any] = Field(default_factory=dict)


class ConclusionView(BaseModel):
    id: int
    problem: str
    op_family: str
    agent: str
    kind: str
    text: str
    tags: list[str]
    evidence: str
    evidence_decision: str | None = None
    strength: float
    support: int
    score: float | None = None


class MethodView(BaseModel):
    id: str
    name: str
    category: str
    tier: int | None = None
    score: float
    why: list[str] = Field(description="the rules that chose it and the signals they saw")
    rationale: str
    how_triton: str | None = None
    how_cuda: str | None = None
    pitfalls: list[str] = Field(default_factory=list)


class TrajectoryEntry(BaseModel):
    candidate_id: str
    language: str | None = None
    decision: str | None = None
    status: str | None = None
    reason: str = ""
    notes: str | None = None
    speedup_eager: float | None = None
    duplicate_of: str | None = None


class RecallResult(BaseModel):
    problem: str
    conclusions: list[ConclusionView]
    methods: list[MethodView]
    signals: list[str] = Field(description="what the decision policy measured about your current state")
    trajectory: list[TrajectoryEntry] = Field(description="your own submissions on this problem, oldest first")
    trajectory_omitted: int = Field(0, description="older submissions left out (detail='full' shows them all)")
    warnings: list[str] = Field(default_factory=list)


class RecordResult(BaseModel):
    id: int
    merged: bool = Field(description="true when it strengthened an existing near-identical conclusion")
    support: int
    strength: float
    message: str


class BestEntry(BaseModel):
    agent: str
    candidate_id: str
    language: str | None = None
    score: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    sol_fraction: float | None = None
    latency_ms: float | None = None
    is_global_best: bool = False
    workloads: list[dict[str, Any]] = Field(default_factory=list)
    source: dict[str, str] = Field(default_factory=dict, description="file name -> source")
    entry_point: str | None = Field(None, description="'file::symbol' that the guard ran, a file of source")


class PeekResult(BaseModel):
    problem: str
    global_best: BestEntry | None = None
    agents: list[BestEntry]
    candidates: int


class AgentStatus(BaseModel):
    agent: str
    problem: str
    attempts: int
    best_candidate: str | None = None
    best_score: float | None = None
    last_decision: str | None = None
    advice: str | None = None


class StatusView(BaseModel):
    version: str
    you: str
    device: dict[str, Any]
    queue: int = Field(description="evaluations waiting or running")
    problems: int
    agents: list[AgentStatus]
    budgets: dict[str, Any]
