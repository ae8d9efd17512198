"""The decision and the advice, from code and thresholds alone.

ACCEPT: faster than the agent's best by more than the threshold (or the agent's first
correct candidate); it also becomes the global best when it beats that by the threshold.
KEEP: within the threshold either way (a lateral working point). REVERT: slower by more
than the threshold; the verdict names the best to go back to. REJECT: a gate failed.

The comparison is the geometric mean over common workloads of T_best / T_new. Its
threshold is the larger of the noise floor (1%) and ``noise_sigmas`` standard errors of the
log of that mean, from the reported spread of both candidates' medians, the incumbent's
counted no more than the challenger's (``incumbent_spread``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from .config import GuardConfig
from .verdict import Advice, Decision


@dataclass
class Comparison:
    speedup: float  # > 1: the new candidate is faster
    threshold: float


def compare(
    new: dict[str, tuple[float, float]], old: dict[str, tuple[float, float]], cfg: GuardConfig
) -> Comparison | None:
    """``new``/``old``: workload -> (median latency, relative standard error), of the challenger
    and of the incumbent (``incumbent_spread``)."""
    common = [w for w in new if w in old and new[w][0] > 0 and old[w][0] > 0]
    if not common:
        return None
    logs = [math.log(old[w][0] / new[w][0]) for w in common]
    var = sum(spread(new[w][1], cfg) ** 2 + incumbent_spread(old[w][1], new[w][1], cfg) ** 2 for w in common)
    var /= len(common) ** 2
    return Comparison(math.exp(sum(logs) / len(logs)), threshold_from_log(cfg.noise_sigmas * math.sqrt(var), cfg))


def spread(rel_se: float, cfg: GuardConfig) -> float:
    """A median's relative standard error as a threshold may use it: the figure comes from the
    candidate's process, and a red team's incumbent that reported 1000 got a threshold of
    5e23% that no honest challenger could pass (it kept the global best). Bounded by
    ``rel_se_cap``; a spread that large says the median decides little anyway."""
    return min(max(rel_se, 0.0), cfg.rel_se_cap)


def incumbent_spread(incumbent_rel_se: float, challenger_rel_se: float, cfg: GuardConfig) -> float:
    """The incumbent's spread as a comparison with a challenger uses it: no more than the
    challenger's own. Both figures come from candidates' processes; the challenger's own can
    only widen its bar, but an incumbent that reported its spread at ``rel_se_cap`` widened
    every bar against it, and a stored KEEP is never paired: no honest challenger under about
    1.16x on four workloads could take its title (red team, session 45). A narrower bar than
    the truth turns a KEEP into an ACCEPT or REVERT inside the pairing band, which the paired
    re-measurement, whose spread between its turns the guard works out itself, then decides."""
    return min(spread(incumbent_rel_se, cfg), spread(challenger_rel_se, cfg))


def threshold_from_log(margin: float, cfg: GuardConfig) -> float:
    """A margin on the log of the speedup as the fraction ``decide`` compares with: a speedup
    must exceed exp(margin), not 1 + margin (which lets a 0.35 margin pass at 1.42x, 4.3
    standard errors where 5 were asked), and at least the noise floor."""
    return max(cfg.noise_floor, math.expm1(min(margin, 50.0)))


def decide(comparison: Comparison | None) -> Decision:
    if comparison is None:
        return "ACCEPT"
    if comparison.speedup > 1 + comparison.threshold:
        return "ACCEPT"
    if comparison.speedup < 1 / (1 + comparison.threshold):
        return "REVERT"
    return "KEEP"


def beats(comparison: Comparison | None) -> bool:
    return comparison is None or comparison.speedup > 1 + comparison.threshold


def advise(
    decision: str,
    history: list[dict[str, Any]],
    sol_fraction: float | None,
    best_sol_fraction: float | None,
    cfg: GuardConfig,
    now: float | None = None,
) -> Advice:
    """``history``: this agent's earlier verdicts on the problem, oldest first, each with
    ``decision``, ``created_at``, ``id``, ``language``, ``notes``, ``reason``."""
    now = time.time() if now is None else now
    attempts = len(history) + 1
    non_improving = 0 if decision == "ACCEPT" else 1
    if decision != "ACCEPT":
        for h in reversed(history):
            if h["decision"] == "ACCEPT":
                break
            non_improving += 1
    reached = max(x for x in (sol_fraction, best_sol_fraction, 0.0) if x is not None)
    if reached >= cfg.stop_sol_fraction:
        return Advice(
            action="stop",
            message=f"stop: {reached:.0%} of speed of light reached (target {cfg.stop_sol_fraction:.0%})",
            attempts=attempts,
            non_improving=non_improving,
        )
    if cfg.max_attempts is not None and attempts >= cfg.max_attempts:
        return Advice(
            action="stop",
            message=f"stop: attempt budget of {cfg.max_attempts} spent",
            attempts=attempts,
            non_improving=non_improving,
        )
    if cfg.time_budget_s is not None and history and now - history[0]["created_at"] >= cfg.time_budget_s:
        return Advice(
            action="stop",
            message=f"stop: time budget of {cfg.time_budget_s:.0f} s spent",
            attempts=attempts,
            non_improving=non_improving,
        )
    if non_improving >= cfg.redraft_after:
        recent = history[-(cfg.redraft_after - 1) :] if cfg.redraft_after > 1 else []
        tried = [
            f"{h['id']} [{h.get('language') or '?'}] {h['decision']}: "
            + ((h.get("notes") or h.get("reason") or "")[:120])
            for h in recent
        ]
        return Advice(
            action="redraft",
            message=(
                f"redraft: {non_improving} evaluations without improvement. Stop tuning this "
                "design: try a different algorithm, another DSL (Triton, CUDA C++, library "
                "dispatch) or another data layout. Already tried is listed below."
            ),
            attempts=attempts,
            non_improving=non_improving,
            tried=tried,
        )
    return Advice(action="continue", message="continue", attempts=attempts, non_improving=non_improving)
