"""Tool results an agent can afford: one copy of the data, numbers at the precision they
were measured to, and internals only when asked for.

Claude Code (2.1.x) and Codex (codex-rs) hand a tool's ``structuredContent`` to the model,
serialized as JSON, and ignore the text blocks when it is present. So the structured
content is what an agent pays for, and it is kept small here (fields at their default left
out, numbers rounded, per-call internals behind ``detail="full"``). The text block carries a
one-line summary for people reading a client's log; only a client that negotiated a protocol
older than 2025-06-18 (before structured content existed) gets the structured content as
compact JSON in the text block instead.

Every tool result goes through :func:`result`; the rounding is done here and nowhere else.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from mcp.types import CallToolResult, TextContent
from mcp_types.version import is_version_at_least
from pydantic import BaseModel

Detail = Literal["brief", "full"]
STRUCTURED_SINCE = "2025-06-18"  # the protocol revision that added structuredContent

# significant digits, by what a number measures
LATENCY = 4  # *_ms: a median over timed iterations; its noise (rel_se) is rarely below 0.1%
RATIO = 3  # speedups, scores, SOL fractions, thresholds: ratios of two such latencies
NOISE = 2  # rel_se and the other timing internals: an estimate of the noise itself
DEFAULT = 4  # any other measured number (device ceilings, rates)
# parts whose numbers are all timing internals (except their latencies)
INTERNALS = {"timing", "outside_clock", "nvml", "phases_s"}
# parts whose numbers are settings or specifications, not measurements: left as they are
EXACT = {"budgets", "tolerances", "axes"}
RATIO_KEYS = {"score", "best_score", "threshold", "strength", "sol_score", "sol_fraction", "stop_sol_fraction"}
NOISE_KEYS = {"rel_se", "rel_band", "noise_floor"}


def sig(x: float, digits: int) -> float:
    """``x`` to ``digits`` significant digits."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def digits_for(key: str | None, within: frozenset[str]) -> int | None:
    """Significant digits of a number under ``key`` (``None``: leave it exact)."""
    if within & EXACT:
        return None
    k = key or ""
    if k.endswith("_at"):  # a timestamp: whole seconds
        return 0
    if k.endswith("_ms"):
        return LATENCY
    if k in NOISE_KEYS:
        return NOISE
    if k in RATIO_KEYS or k.startswith("speedup") or k.endswith("_speedup"):
        return RATIO
    if within & INTERNALS:
        return NOISE
    return DEFAULT


def round_numbers(data: Any, key: str | None = None, within: frozenset[str] = frozenset()) -> Any:
    """A JSON-ready value with every float rounded by :func:`digits_for` (ints are counts
    and sizes, kept exact)."""
    if isinstance(data, dict):
        inner = within | {key} if key else within
        return {k: round_numbers(v, k, inner) for k, v in data.items()}
    if isinstance(data, list):
        return [round_numbers(v, key, within) for v in data]
    if isinstance(data, float) and not isinstance(data, bool):
        d = digits_for(key, within)
        if d is None:
            return data
        return int(round(data)) if d == 0 and math.isfinite(data) else sig(data, d)
    return data


def dump(model: BaseModel, include: Any = None) -> dict[str, Any]:
    """A model as compact, rounded JSON data: only the fields in ``include`` (all when
    ``None``), none left at its default."""
    data = model.model_dump(mode="json", by_alias=True, exclude_defaults=True, include=include)
    return round_numbers(data)


def text_of(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def result(model: BaseModel, summary: str, *, include: Any = None, protocol: str | None = None) -> CallToolResult:
    """The tool result: ``model`` (restricted to ``include``) as structured content, and a
    summary as text (the data itself as compact JSON for a client too old to read
    structured content)."""
    data = dump(model, include)
    legacy = protocol is not None and not is_version_at_least(protocol, STRUCTURED_SINCE)
    text = text_of(data) if legacy else summary
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


# -- what a brief answer keeps (allow-lists: a field added to the guard's verdict stays out
# of per-call results until someone decides an agent needs it) -------------------------------
WORKLOAD_BRIEF = {
    "uuid",
    "axes",
    "latency_ms",
    "eager_ms",
    "compile_ms",
    "sol_ms",
    "bound",
    "speedup_eager",
    "speedup_compile",
    "sol_score",
    "sol_fraction",
    "rel_se",
}
VERDICT_BRIEF: dict[str, Any] = {
    **dict.fromkeys(
        (
            "candidate_id",
            "problem",
            "agent",
            "decision",
            "status",
            "gate",
            "reason",
            "diagnostic",
            "first_failing_workload",
            "score",
            "speedup_eager",
            "speedup_compile",
            "sol_fraction",
            "latency_ms",
            "speedup_vs_best",
            "threshold",
            "agent_best_id",
            "global_best_id",
            "is_global_best",
            "duplicate_of",
            "parent",
            "repeats",
            "advice",
        ),
        True,
    ),
    # what was checked, not the per-workload error figures kept for SOL-ExecBench traces
    "checked": {"visible_workloads", "heldout_workloads", "rounds", "rounds_skipped", "determinism"},
    "workloads": {"__all__": WORKLOAD_BRIEF},
    "paired": {"__all__": {"incumbent", "why", "paired_speedup", "threshold", "note"}},
}
SUBMIT_BRIEF: dict[str, Any] = {
    **dict.fromkeys(("state", "job_id", "candidate_id", "message", "position", "progress"), True),
    "verdict": VERDICT_BRIEF,
}
METHOD_BRIEF = {"id", "name", "category", "tier", "score", "why", "rationale"}
TRAJECTORY_BRIEF = 10  # a brief recall shows your last this many submissions
NOTES_BRIEF = 120  # characters of each one's notes
