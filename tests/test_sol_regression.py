"""Our own SOL-ExecBench-format solutions (tests/data/sol-regression): each honest one PASSED,
each bug and reward hack REJECTed, with the status and reason its manifest says."""

from __future__ import annotations

import json

import pytest

from guard.candidates.load import from_solution_json

from helpers import DATA, SOL_EXAMPLES, make_guard

SUITE = DATA / "sol-regression"
CASES = json.loads((SUITE / "manifest.json").read_text())


@pytest.fixture(scope="module")
def sol_guard(session_tmp):
    g = make_guard(session_tmp / "ws-sol-regression", correctness_rounds=1, heldout_rounds=1)
    for problem in sorted({c["problem"] for c in CASES}):
        g.store.import_path(SOL_EXAMPLES / problem)
    yield g
    g.close()


@pytest.mark.parametrize(
    "case",
    # Triton's interpreter runs the honest Triton solution's every program in Python: ~25 s
    [pytest.param(c, marks=[pytest.mark.slow] if "triton" in c["solution"] else []) for c in CASES],
    ids=[c["solution"].removesuffix(".json") for c in CASES],
)
def test_sol_format_solution_gets_its_expected_verdict(sol_guard, case):
    solution = from_solution_json((SUITE / case["solution"]).read_text())
    assert solution.spec.destination_passing_style
    name = json.loads((SOL_EXAMPLES / case["problem"] / "definition.json").read_text())["name"]
    v = sol_guard.evaluate(solution, name, agent=case["solution"])
    want = case["expect"]
    assert (v.decision, v.status) == (want["decision"], want["status"]), f"{v.reason}\n{v.diagnostic}"
    assert want.get("reason", "") in v.reason
