"""The deterministic decision policy: measured signals of an agent's current state ->
ranked playbook methods, each with the rules that chose it.

Signals come from verdicts only (guard.verdict.Verdict): the bound and fraction of speed of
light of the agent's best, which of its workloads lag, the failure class of its last
REJECT, and plateau advice. Each rule is a small named function; a method's rank is the sum
of the weights of the rules whose signal it answers, plus how well its op family and
backend fit. Nothing here is learned or random.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from guard.verdict import Verdict

from .playbook import Method, load_methods

FAILURE_SIGNAL = {
    "COMPILE_ERROR": "compile_error",
    "INCORRECT_NUMERICAL": "incorrect_numerical",
    "INCORRECT_SHAPE": "incorrect_shape",
    "INCORRECT_DTYPE": "incorrect_dtype",
    "RUNTIME_ERROR": "runtime_error",
    "TIMEOUT": "timeout",
    "REWARD_HACK": "reward_hack",
}


@dataclass
class State:
    """What the policy looks at."""

    op_family: str
    best: Verdict | None = None  # the agent's current best (a measured verdict)
    last: Verdict | None = None  # the agent's latest verdict
    language: str | None = None  # of the best, else of the latest


@dataclass
class Fired:
    rule: str
    signal: str
    weight: float
    because: str


@dataclass
class Ranked:
    method: Method
    score: float
    rules: list[Fired] = field(default_factory=list)


# -- rules ----------------------------------------------------------------------------------


def rule_no_correct_candidate(s: State) -> list[Fired]:
    if s.best is None:
        return [
            Fired(
                "no_correct_candidate",
                "no_correct_candidate",
                3.0,
                "no candidate of this agent has passed yet: get a correct one first (start from a seed)",
            )
        ]
    return []


def rule_failure_class(s: State) -> list[Fired]:
    if s.last is None or s.last.decision != "REJECT":
        return []
    text = f"{s.last.reason} {s.last.diagnostic or ''}"
    signal = "nondeterministic" if "non-deterministic" in text else FAILURE_SIGNAL.get(s.last.status)
    if signal is None:
        return []
    return [Fired("failure_class", signal, 3.0, f"the last candidate was rejected: {s.last.status}")]


def rule_bound(s: State) -> list[Fired]:
    if s.best is None or not s.best.workloads:
        return []
    bounds = [w.bound for w in s.best.workloads if w.bound]
    if not bounds:
        return []
    major = max(set(bounds), key=bounds.count)
    return [
        Fired(
            "bound",
            f"{major}_bound",
            1.0,
            f"{bounds.count(major)} of {len(bounds)} workloads are {major}-bound at speed of light",
        )
    ]


def rule_distance_to_sol(s: State) -> list[Fired]:
    if s.best is None or s.best.sol_fraction is None:
        return []
    f = s.best.sol_fraction
    if f < 0.3:
        return [Fired("distance_to_sol", "far_from_sol", 1.0, f"the best runs at {f:.0%} of speed of light")]
    if f >= 0.7:
        return [Fired("distance_to_sol", "near_sol", 1.0, f"the best already runs at {f:.0%} of speed of light")]
    return []


def rule_lagging_workloads(s: State) -> list[Fired]:
    """Small workloads far behind large ones point at launch overhead or too little
    parallelism; large ones behind point at tiling and reuse."""
    if s.best is None:
        return []
    ws = [w for w in s.best.workloads if w.sol_fraction is not None and w.latency_ms]
    if len(ws) < 4:
        return []
    ws.sort(key=lambda w: w.latency_ms)
    half = len(ws) // 2
    small, large = ws[:half], ws[-half:]
    fs = sum(w.sol_fraction for w in small) / len(small)
    fl = sum(w.sol_fraction for w in large) / len(large)
    out = []
    if fs < 0.5 * fl:
        out.append(
            Fired(
                "lagging_workloads",
                "small_shapes_lag",
                1.5,
                f"small workloads reach {fs:.0%} of SOL, large ones {fl:.0%}",
            )
        )
        if max(w.latency_ms for w in small) < 0.02:
            out.append(
                Fired(
                    "lagging_workloads",
                    "launch_overhead",
                    1.0,
                    "the small workloads take under 20 us: fixed costs dominate",
                )
            )
        out.append(Fired("lagging_workloads", "low_parallelism", 1.0, "small workloads may not give every SM work"))
    elif fl < 0.5 * fs:
        out.append(
            Fired(
                "lagging_workloads",
                "large_shapes_lag",
                1.5,
                f"large workloads reach {fl:.0%} of SOL, small ones {fs:.0%}",
            )
        )
    return out


def rule_plateau(s: State) -> list[Fired]:
    verdict = s.last or s.best
    if verdict is not None and verdict.advice.action == "redraft":
        return [Fired("plateau", "plateau", 2.0, f"{verdict.advice.non_improving} evaluations without improvement")]
    return []


RULES: list[Callable[[State], list[Fired]]] = [
    rule_no_correct_candidate,
    rule_failure_class,
    rule_bound,
    rule_distance_to_sol,
    rule_lagging_workloads,
    rule_plateau,
]


def signals(state: State) -> list[Fired]:
    out: list[Fired] = []
    for rule in RULES:
        out += rule(state)
    return out


def rank(state: State, k: int = 5, methods: tuple[Method, ...] | None = None) -> tuple[list[Ranked], list[Fired]]:
    """Methods ranked for ``state``; also returns every rule that fired."""
    fired = signals(state)
    methods = methods if methods is not None else load_methods()
    ranked: list[Ranked] = []
    for m in methods:
        if m.op_families and state.op_family not in m.op_families:
            continue
        hits = [f for f in fired if f.signal in m.signals]
        if not hits:
            continue
        score = sum(f.weight for f in hits)
        score += 0.5 if m.op_families else 0.2  # specific to this family ranks above generic
        if state.language and state.language in m.backends:
            score += 0.3
        ranked.append(Ranked(m, round(score, 3), hits))
    ranked.sort(key=lambda r: (-r.score, r.method.tier or 9, r.method.id))
    return ranked[: max(1, k)], fired
