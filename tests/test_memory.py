"""Memory: conclusions (evidence, near-duplicates, retention, ranked recall), trajectories,
and the decision policy, rule by rule."""

from __future__ import annotations

import time

import pytest

from guard.archive.db import Database
from guard.problems.problem import load_problem
from guard.verdict import Advice, Verdict, WorkloadResult
from memory import conclusions as C
from memory import policy as P
from memory.playbook import Method
from memory.store import Memory, jaccard
from seeds import SEEDS_DIR

from helpers import add_judged_candidate, add_running_candidate

RMS = "rmsnorm_llama3_8b"


@pytest.fixture
def db(tmp_path):
    return Database(tmp_path / "w.db")


@pytest.fixture
def problem():
    return load_problem(SEEDS_DIR / RMS, "seed")


def test_record_needs_evaluated_evidence_on_the_problem(db, problem):
    m = Memory(db)
    with pytest.raises(C.MemoryError_, match="not a candidate"):
        m.record("a", problem, "text", "insight", "c-none")
    add_running_candidate(db, "c-run")
    with pytest.raises(C.MemoryError_, match="no verdict yet"):
        m.record("a", problem, "text", "insight", "c-run")
    add_judged_candidate(db, "c-other", problem="softmax_lm_vocab_fp32")
    with pytest.raises(C.MemoryError_, match="evaluated on"):
        m.record("a", problem, "text", "insight", "c-other")
    add_judged_candidate(db, "c-ok")
    for bad_kind in ("rumor", ""):
        with pytest.raises(C.MemoryError_):
            m.record("a", problem, "text", bad_kind, "c-ok")
    with pytest.raises(C.MemoryError_, match="longer"):
        m.record("a", problem, "x" * 2000, "insight", "c-ok")
    out = m.record("a", problem, "one row per program with BLOCK = hidden size", "insight", "c-ok", ["launch"])
    assert out["merged"] is False and out["strength"] > 0.7


def test_evidence_strength_follows_the_verdict():
    strength = C.evidence_strength
    assert strength("insight", "ACCEPT", "PASSED", 3.0) > strength("insight", "KEEP", "PASSED", 1.0)
    assert strength("insight", "REJECT", "INCORRECT_NUMERICAL", None) < 0.1
    assert strength("pitfall", "REJECT", "INCORRECT_NUMERICAL", None) > strength("pitfall", "ACCEPT", "PASSED", 2)


def test_near_duplicates_merge(db, problem):
    m = Memory(db)
    add_judged_candidate(db, "c1")
    add_judged_candidate(db, "c2", speedup=4.0)
    a = m.record("a", problem, "vectorized 16-byte loads of each row double the bandwidth", "insight", "c1")
    b = m.record(
        "a", problem, "Vectorized 16-byte loads of each row double the bandwidth.", "insight", "c2", ["memory"]
    )
    assert b["merged"] and b["id"] == a["id"] and b["support"] == 2 and "memory" in b["tags"]
    # the stronger evidence is the one shown beside the strength it gave
    assert b["evidence"] == "c2" and b["evidence_speedup"] == 4.0 and b["strength"] > a["strength"]
    again = m.record("a", problem, "vectorized 16-byte loads of each row double the bandwidth", "insight", "c2")
    assert again["merged"] and again["support"] == 2  # one candidate cited twice supports once
    for cited in ("c1", "c2", "c1", "c2"):  # however the citations alternate
        again = m.record("a", problem, "vectorized 16-byte loads of each row double the bandwidth", "insight", cited)
    assert again["support"] == 2
    c = m.record("a", problem, "vectorized loads of each row hurt on small batches", "pitfall", "c2")
    assert not c["merged"]
    assert m.count() == 2
    assert jaccard("aa bb cc dd", "aa bb cc dd ee") == pytest.approx(0.8)


def test_agents_words_never_borrow_or_change_others_measurements(db, problem):
    """What one agent records rests on its own judged candidates: it cannot cite another
    agent's ACCEPT for its words, nor merge into (strengthen, retag, refresh) another agent's
    conclusion by saying nearly the same (red team, session 42: both were possible)."""
    m = Memory(db)
    add_judged_candidate(db, "c-alice", agent="alice", decision="REJECT", status="INCORRECT_NUMERICAL", speedup=None)
    add_judged_candidate(db, "c-bob", agent="bob", speedup=3.0)
    add_judged_candidate(db, "c-mallory", agent="mallory", speedup=1.2)
    alice = m.record("alice", problem, "torch compile with max autotune is slower here", "insight", "c-alice")
    with pytest.raises(C.MemoryError_, match="bob's, not yours"):
        m.record("mallory", problem, "always use torch compile max autotune", "insight", "c-bob")
    echo = m.record(
        "mallory", problem, "torch compile with max autotune is slower here!", "insight", "c-mallory", ["always"]
    )
    assert not echo["merged"] and echo["id"] != alice["id"]
    kept = next(c for c in m.recall(problem, "autotune", "problem", 10) if c["id"] == alice["id"])
    assert (kept["strength"], kept["support"], kept["tags"], kept["evidence"]) == (
        alice["strength"],
        1,
        [],
        "c-alice",
    )


def test_retention_by_count_drops_the_most_prolific_agents_first(db, problem):
    """With a count per problem, one agent's flood of records pushes out its own oldest, not
    the other agents' few."""
    m = Memory(db, C.Retention(per_problem=4))
    add_judged_candidate(db, "c-a", agent="alice")
    add_judged_candidate(db, "c-b", agent="bob")
    m.record("alice", problem, "wide tiles help prefill", "insight", "c-a")
    m.record("bob", problem, "narrow rows hurt decode", "pitfall", "c-b")
    for i in range(20):
        add_judged_candidate(db, f"c-m{i}", agent="mallory")
        m.record("mallory", problem, f"claim number {i} {'x' * i} about tiles {i * 7919}", "insight", f"c-m{i}")
    left = m.recall(problem, "", "problem", 10)
    assert sorted(c["agent"] for c in left) == ["alice", "bob", "mallory", "mallory"]
    assert {c["text"] for c in left if c["agent"] == "mallory"} == {
        f"claim number {i} {'x' * i} about tiles {i * 7919}" for i in (18, 19)
    }


def test_recall_ranks_by_relevance_scope_and_strength(db, problem):
    m = Memory(db)
    add_judged_candidate(db, "c1", speedup=3.0)
    add_judged_candidate(db, "c2", decision="KEEP", speedup=1.0)
    add_judged_candidate(db, "c3", problem="softmax_lm_vocab_fp32")
    soft = load_problem(SEEDS_DIR / "softmax_lm_vocab_fp32", "seed")
    m.record("a", problem, "warp shuffle reduction beats shared memory for the row sum", "insight", "c1")
    m.record("a", problem, "autotuning num_warps helps the large token counts", "insight", "c2")
    m.record("a", soft, "online softmax with a warp shuffle reduction", "insight", "c3")
    top = m.recall(problem, "warp shuffle reduction", "problem", 5)
    assert top[0]["evidence"] == "c1" and all(t["problem"] == RMS for t in top)
    everywhere = m.recall(problem, "warp shuffle", "any", 5)
    assert {t["evidence"] for t in everywhere} >= {"c1", "c3"}
    assert everywhere[0]["problem"] == RMS  # same problem ranks above another family's
    assert m.recall(problem, "", "problem", 5)  # no query: newest in scope
    with pytest.raises(C.MemoryError_):
        m.recall(problem, "x", "galaxy", 5)


def test_recall_relevance_follows_a_conclusions_current_text(db, problem):
    """Recall keeps each conclusion's words between calls; a row whose text or tags changed
    is read again, not scored with the old words."""
    m = Memory(db)
    add_judged_candidate(db, "c1")
    add_judged_candidate(db, "c2")
    m.record("a", problem, "decode shapes want eight bf16 values per thread", "insight", "c1", ["vectorised", "loads"])
    m.record("a", problem, "decode shapes want fewer warps per row", "insight", "c2")
    query = "decode vectorised loads"
    before = {t["evidence"]: t["score"] for t in m.recall(problem, query, "problem", 5)}
    assert before["c1"] > before["c2"], before
    with db.transaction() as c:  # the tags move from one conclusion to the other
        c.execute("UPDATE conclusions SET tags = '[]' WHERE evidence = 'c1'")
        c.execute("""UPDATE conclusions SET tags = '["vectorised", "loads"]' WHERE evidence = 'c2'""")
    after = {t["evidence"]: t["score"] for t in m.recall(problem, query, "problem", 5)}
    assert after["c2"] > after["c1"], after


def test_retention_by_count_and_age(db, problem):
    m = Memory(db, C.Retention(per_problem=3))
    texts = [
        "wide tiles help prefill",
        "narrow rows hurt decode",
        "stages three beat two",
        "warps eight suit hidden sizes",
        "vector loads need alignment",
    ]
    for i, text in enumerate(texts):
        add_judged_candidate(db, f"c{i}")
        m.record("a", problem, text, "insight", f"c{i}")
    assert m.count() == 3
    kept = [c["text"] for c in m.recall(problem, "", "problem", 10)]
    assert sorted(kept) == sorted(texts[2:])
    with db.transaction() as c:
        dropped = C.prune(c, C.Retention(max_age_days=1), now=time.time() + 2 * 86400)
    assert dropped == 3 and m.count() == 0


# -- the decision policy, rule by rule ----------------------------------------------------------


def verdict(decision="ACCEPT", status="PASSED", workloads=(), sol=None, advice="continue", reason="", diag=None):
    return Verdict(
        candidate_id="c",
        problem=RMS,
        agent="a",
        decision=decision,
        status=status,
        reason=reason,
        diagnostic=diag,
        sol_fraction=sol,
        workloads=list(workloads),
        advice=Advice(action=advice, message=advice, non_improving=5 if advice == "redraft" else 0),
    )


def wl(lat, frac, bound="memory"):
    return WorkloadResult(uuid=f"w{lat}", latency_ms=lat, sol_fraction=frac, bound=bound)


def signals_of(state):
    return {f.signal for f in P.signals(state)}


def test_rule_no_correct_candidate():
    assert "no_correct_candidate" in signals_of(P.State("rmsnorm"))


@pytest.mark.parametrize(
    "status,signal",
    [
        ("COMPILE_ERROR", "compile_error"),
        ("INCORRECT_NUMERICAL", "incorrect_numerical"),
        ("INCORRECT_SHAPE", "incorrect_shape"),
        ("INCORRECT_DTYPE", "incorrect_dtype"),
        ("RUNTIME_ERROR", "runtime_error"),
        ("TIMEOUT", "timeout"),
        ("REWARD_HACK", "reward_hack"),
    ],
)
def test_rule_failure_class(status, signal):
    s = P.State("rmsnorm", last=verdict("REJECT", status))
    assert signal in signals_of(s)


def test_rule_failure_class_nondeterminism():
    s = P.State(
        "rmsnorm",
        last=verdict("REJECT", "INCORRECT_NUMERICAL", diag="differs between two calls (non-deterministic: atomics)"),
    )
    assert "nondeterministic" in signals_of(s)


def test_rule_bound_and_distance():
    far = P.State("rmsnorm", best=verdict(workloads=[wl(1, 0.1), wl(2, 0.1, "compute"), wl(3, 0.1)], sol=0.1))
    assert {"memory_bound", "far_from_sol"} <= signals_of(far)
    near = P.State("matmul", best=verdict(workloads=[wl(1, 0.8, "compute")] * 3, sol=0.8))
    assert {"compute_bound", "near_sol"} <= signals_of(near)
    middle = P.State("matmul", best=verdict(workloads=[wl(1, 0.5)], sol=0.5))
    assert not {"far_from_sol", "near_sol"} & signals_of(middle)


def test_rule_lagging_workloads():
    lagging = [wl(0.005, 0.05), wl(0.006, 0.05), wl(0.5, 0.6), wl(0.8, 0.7)]
    small_lag = P.State("rmsnorm", best=verdict(workloads=lagging))
    assert {"small_shapes_lag", "launch_overhead", "low_parallelism"} <= signals_of(small_lag)
    large_lag = P.State("rmsnorm", best=verdict(workloads=[wl(0.005, 0.6), wl(0.006, 0.6), wl(0.5, 0.1), wl(0.8, 0.1)]))
    assert "large_shapes_lag" in signals_of(large_lag) and "small_shapes_lag" not in signals_of(large_lag)
    even = P.State("rmsnorm", best=verdict(workloads=[wl(0.005, 0.5), wl(0.006, 0.5), wl(0.5, 0.5), wl(0.8, 0.5)]))
    assert not {"small_shapes_lag", "large_shapes_lag"} & signals_of(even)


def test_rule_plateau():
    s = P.State("rmsnorm", best=verdict(sol=0.4), last=verdict("REVERT", advice="redraft"))
    assert "plateau" in signals_of(s)


def _m(mid, signals, families=(), backends=("triton",)):
    return Method(
        id=mid,
        name=mid,
        category="memory",
        op_families=list(families),
        signals=list(signals),
        backends=list(backends),
        rationale="a rationale long enough to pass",
        how_triton="do it",
        how_cuda="do it in C++",
    )


def test_rank_orders_by_fired_rules_family_and_backend():
    methods = (
        _m("generic_memory", ["memory_bound"]),
        _m("rms_specific", ["memory_bound"], ["rmsnorm"]),
        _m("fix_numerics", ["incorrect_numerical"]),
        _m("other_family", ["memory_bound"], ["matmul"]),
        _m("cuda_only", ["memory_bound"], backends=("cuda_cpp",)),
    )
    state = P.State(
        "rmsnorm",
        best=verdict(workloads=[wl(1, 0.5)] * 4, sol=0.5),
        last=verdict("REJECT", "INCORRECT_NUMERICAL"),
        language="triton",
    )
    ranked, fired = P.rank(state, k=10, methods=methods)
    ids = [r.method.id for r in ranked]
    assert ids[0] == "fix_numerics"  # the failure of the last candidate comes first
    assert ids.index("rms_specific") < ids.index("generic_memory") < ids.index("cuda_only")
    assert "other_family" not in ids
    assert ranked[0].rules[0].rule == "failure_class"
    assert {f.rule for f in fired} >= {"failure_class", "bound"}


def test_an_agents_own_near_duplicate_is_found_among_many_others(db, problem):
    """The search for one's own near-duplicate took the 20 best matches first and the agent
    after: twenty other agents saying the same hid one's own, which then got a second row."""
    m = Memory(db)
    text = "fusing the weight multiply into the reduction saves a pass"
    add_judged_candidate(db, "c-mine", agent="me")
    mine = m.record("me", problem, text + " nicely", "insight", "c-mine")  # longer: it ranks below theirs
    for i in range(25):
        add_judged_candidate(db, f"c-o{i}", agent=f"other{i}")
        m.record(f"other{i}", problem, text, "insight", f"c-o{i}")
    add_judged_candidate(db, "c-mine2", agent="me", speedup=3.0)
    again = m.record("me", problem, text + "!", "insight", "c-mine2")
    assert again["merged"] and again["id"] == mine["id"]
