"""Our own SOL-ExecBench-format solutions (tests/data/sol-regression): each honest one PASSED,
each bug and reward hack REJECTed, with the status and reason its manifest says.

A solution whose manifest entry ``requires`` device ``any`` gets its verdict here, on the CPU. One
that needs a GPU (CUDA C++, the kernel DSLs) is checked here as far as the CPU can: it loads, is
destination passing with ``run``'s arguments in the definition's order, passes the static screen
(its defence is at run time), and the CPU guard says plainly why it cannot judge it (no CUDA device
for CUDA C++, after nvcc has compiled it where the toolkit is complete; the DSL's package or the
GPU for a DSL, refused before anything is recorded). ``benchmarks/sol_regression.py`` judges them
all on a GPU; its selection, merging and table are tested at the end."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from guard.builders import dsl_refusal, get_builder
from guard.builders.dsl import DslBuilder
from guard.candidates.load import from_solution_json
from guard.candidates.solution import LANGUAGES
from guard.cascade import GuardError
from guard.export.sol_solution import SolSolution
from guard.screen import screen_solution

from helpers import DATA, FEW_TIMED_CALLS, SOL_EXAMPLES, make_guard

SUITE = DATA / "sol-regression"
CASES = json.loads((SUITE / "manifest.json").read_text())
ON_CPU = [c for c in CASES if c["requires"]["device"] == "any"]
ON_GPU = [c for c in CASES if c["requires"]["device"] == "cuda"]


def _ids(cases):
    return [c["solution"].removesuffix(".json") for c in cases]


def _definition(case):
    return json.loads((SOL_EXAMPLES / case["problem"] / "definition.json").read_text())


@pytest.fixture(scope="module")
def sol_guard(session_tmp):
    # 1-3 timed calls per workload: these cases are decided by the screen and the correctness
    # gate, and an honest one by every gate, not by its figures (the Triton one runs in the
    # interpreter: 24 s with the fast settings' 3-10 calls, 18 s with these)
    g = make_guard(session_tmp / "ws-sol-regression", correctness_rounds=1, heldout_rounds=1, **FEW_TIMED_CALLS)
    for problem in sorted({c["problem"] for c in CASES}):
        g.store.import_path(SOL_EXAMPLES / problem)
    yield g
    g.close()


def test_manifest_covers_every_file_and_every_language():
    listed = [c["solution"] for c in CASES]
    assert sorted(listed) == sorted(p.name for p in SUITE.glob("*.json") if p.name != "manifest.json")
    assert len(set(listed)) == len(listed)
    assert {c["requires"]["device"] for c in CASES} <= {"any", "cuda"}
    honest = {c["language"] for c in CASES if c["expect"]["status"] == "PASSED"}
    assert honest == set(LANGUAGES), "every language the guard judges has an honest solution"
    for c in CASES:
        builder = get_builder(c["language"])
        if isinstance(builder, DslBuilder):  # a DSL: a GPU and its package, named as the guard names it
            assert c["requires"] == {"device": "cuda", "package": builder.requirement.package}, c["solution"]
        if c["requires"]["device"] == "any":  # judged the same on the CPU as on the GPU
            assert c["language"] in ("pytorch", "triton") or c["expect"]["status"] == "REWARD_HACK", c["solution"]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_each_solution_is_what_its_manifest_says(case):
    text = (SUITE / case["solution"]).read_text()
    solution = from_solution_json(text)
    assert solution.spec.destination_passing_style
    assert solution.spec.primary_language == case["language"]
    assert solution.definition == _definition(case)["name"]
    if case["language"] != "tilelang":  # not a SOL-ExecBench language: it runs in KernelArc only
        SolSolution.model_validate_json(text)  # SOL-ExecBench's published schema, strict
    if case["language"] != "cuda_cpp":  # run(inputs..., outputs...) in the definition's order
        d = _definition(case)
        tree = ast.parse(next(s.content for s in solution.sources if s.path == solution.entry_file))
        run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == solution.entry_symbol)
        assert [a.arg for a in run.args.args] == [*d["inputs"], *d["outputs"]]


@pytest.mark.parametrize(
    "case",
    # Triton's interpreter runs the honest Triton solution's every program in Python: ~25 s
    [pytest.param(c, marks=[pytest.mark.slow] if c["language"] == "triton" else []) for c in ON_CPU],
    ids=_ids(ON_CPU),
)
def test_sol_format_solution_gets_its_expected_verdict(sol_guard, case):
    solution = from_solution_json((SUITE / case["solution"]).read_text())
    v = sol_guard.evaluate(solution, _definition(case)["name"], agent=case["solution"])
    want = case["expect"]
    assert (v.decision, v.status) == (want["decision"], want["status"]), f"{v.reason}\n{v.diagnostic}"
    assert want.get("reason", "") in v.reason


@pytest.mark.parametrize("case", ON_GPU, ids=_ids(ON_GPU))
def test_gpu_solution_is_checked_as_far_as_the_cpu_can(sol_guard, case):
    solution = from_solution_json((SUITE / case["solution"]).read_text())
    screen = screen_solution(solution, 256_000, 16)
    assert screen.ok, screen.message()  # a hack here is caught at run time, on the GPU
    name = _definition(case)["name"]
    if case["language"] == "cuda_cpp":
        v = sol_guard.evaluate(solution, name, agent=case["solution"])
        # compiled by nvcc where this machine's toolkit is complete (a compile error would be
        # COMPILE_ERROR), then refused to run: this guard has no CUDA device
        assert (v.decision, v.status) == ("REJECT", "RUNTIME_ERROR"), f"{v.reason}\n{v.diagnostic}"
        assert "no CUDA device" in v.reason
        return
    before = len(sol_guard.db.candidates_for(name))
    why = dsl_refusal(case["language"], "cpu")
    assert why and (case["requires"]["package"] in why or "NVIDIA GPU only" in why)
    with pytest.raises(GuardError) as refused:
        sol_guard.evaluate(solution, name, agent=case["solution"])
    assert str(refused.value) == why or why in str(refused.value)
    assert len(sol_guard.db.candidates_for(name)) == before  # refused, not recorded


# -- benchmarks/sol_regression.py: selection, verdicts against the manifest, merging, table ----
def _entry(case, **got):
    from benchmarks import sol_regression as sr

    e = {"problem": case["problem"], "language": case["language"], "expected": sr.expected(case), **got}
    e["as_expected"] = sr.as_expected(case, e)
    return e


def test_runner_selects_by_language_in_manifest_order():
    from benchmarks import sol_regression as sr

    cases = sr.load_manifest()
    assert cases == CASES and sr.select(cases, None) == cases
    some = sr.select(cases, ["triton", "pytorch", "cuda_cpp"])
    assert {c["language"] for c in some} == {"triton", "pytorch", "cuda_cpp"}
    assert some == [c for c in cases if c in some]
    assert [c["solution"] for c in sr.select(cases, ["tilelang"])] == ["honest_tilelang_dps.json"]
    with pytest.raises(SystemExit):  # a language the guard does not know is refused by argparse
        sr.main(["out", "--only", "fortran"])


def test_runner_judges_against_the_manifest_and_merges_runs(tmp_path: Path, capsys):
    from benchmarks import sol_regression as sr

    by_name = {c["solution"]: c for c in CASES}
    eps, cache, tile = (
        by_name["bug_wrong_eps.json"],
        by_name["hack_cuda_cpp_pointer_cache.json"],
        by_name["honest_tilelang_dps.json"],
    )
    eps_reason = "workload w: KernelArc's near-zero round, stricter than SOL-ExecBench (random inputs only)"
    first = {
        "date": "2026-12-02T00:00:00+00:00",
        "device": {"name": "NVIDIA H200"},
        "solutions": {
            "bug_wrong_eps": _entry(eps, decision="REJECT", status="INCORRECT_NUMERICAL", reason=eps_reason, wall_s=9),
            "hack_cuda_cpp_pointer_cache": _entry(
                cache, decision="ACCEPT", status="PASSED", median_ms=0.004, wall_s=50
            ),
            "honest_tilelang_dps": _entry(tile, status="NOT_INSTALLED", reason="need the package tilelang"),
        },
    }
    assert first["solutions"]["bug_wrong_eps"]["as_expected"]
    assert not first["solutions"]["hack_cuda_cpp_pointer_cache"]["as_expected"]  # a hack that passed
    assert not sr.as_expected(eps, {"decision": "REJECT", "status": "INCORRECT_NUMERICAL", "reason": "random"})
    line = sr.line("hack_cuda_cpp_pointer_cache", first["solutions"]["hack_cuda_cpp_pointer_cache"])
    assert line == (
        "hack_cuda_cpp_pointer_cache [cuda_cpp]: expected REJECT REWARD_HACK, got ACCEPT PASSED: MISMATCH "
        "(50 s, 4.0 us/call)"
    )
    assert sr.line("honest_tilelang_dps", first["solutions"]["honest_tilelang_dps"]).startswith(
        "honest_tilelang_dps [tilelang]: expected ACCEPT PASSED, got NOT_INSTALLED: MISMATCH"
    )
    later = {
        "date": "2026-12-02T01:00:00+00:00",
        "device": {"name": "NVIDIA H200"},
        "solutions": {
            "honest_tilelang_dps": _entry(tile, decision="ACCEPT", status="PASSED", median_ms=0.0027, wall_s=130),
            "bug_wrong_eps": _entry(eps, status="SKIPPED", reason="the run's budget of 480 s was spent"),
        },
    }
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(later))
    assert sr.main(["--render", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    assert "2 of 3 solutions got the verdict" in table
    rows = {r.split(" | ")[0].strip("| "): r for r in table.splitlines() if r.startswith("| ")}
    assert rows["honest_tilelang_dps"] == (
        "| honest_tilelang_dps | tilelang | rmsnorm_h4096 | ACCEPT PASSED | ACCEPT PASSED | yes | 2.7 | 130 |"
    )
    assert rows["bug_wrong_eps"].startswith(
        "| bug_wrong_eps | pytorch | rmsnorm_h4096 | REJECT INCORRECT_NUMERICAL | REJECT INCORRECT_NUMERICAL | yes |"
    )
    assert "| REJECT REWARD_HACK | ACCEPT PASSED | **no** |" in rows["hack_cuda_cpp_pointer_cache"]
    assert "- bug_wrong_eps: INCORRECT_NUMERICAL: workload w: KernelArc's near-zero round" in table
