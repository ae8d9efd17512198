"""Traces and solutions out, in SOL-ExecBench's published schema (our own pydantic models of
it): the models enforce the schema's rules; a workspace's verdicts export as traces those
models accept; exported solutions load back into the guard unchanged."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
from pydantic import ValidationError

from guard.candidates.load import from_solution_json, from_source
from guard.export import sol_trace as T
from guard.export.sol_export import TRACES_FILE, export_problem
from guard.export.sol_solution import SolSolution, export_solution
from guard.problems.problem import load_problem
from kernelarc_mcp.cli import main

from helpers import SOL_EXAMPLES, make_guard, unique

ENV = {"hardware": "NVIDIA_H200", "libs": {"torch": "2.9.0"}}
WORKLOAD = {
    "uuid": "w1",
    "axes": {"batch_size": 4},
    "inputs": {"x": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}},
}


def _trace(**evaluation):
    return T.Trace.model_validate(
        {
            "definition": "rmsnorm",
            "solution": "s1",
            "workload": WORKLOAD,
            "evaluation": {"environment": ENV, "timestamp": "2026-12-01T00:00:00Z", **evaluation},
        }
    )


def test_trace_models_follow_the_published_nullable_table():
    corr = {"max_relative_error": 1e-3, "max_absolute_error": 2e-3}
    perf = {"latency_ms": 0.01, "reference_latency_ms": 0.02, "speedup_factor": 2.0}
    ok = _trace(status="PASSED", correctness=corr, performance=perf)
    assert ok.workload.tolerance.required_matched_ratio == 0.99  # the schema's default
    assert json.loads(ok.to_line())["evaluation"]["performance"]["speedup_factor"] == 2.0
    _trace(status="INCORRECT_NUMERICAL", correctness=corr)
    _trace(status="COMPILE_ERROR", log="nvcc: error")
    for bad in (
        dict(status="PASSED", correctness=corr),  # performance missing
        dict(status="INCORRECT_NUMERICAL", correctness=corr, performance=perf),
        dict(status="REWARD_HACK", correctness=corr),
        dict(status="SKIPPED"),
        dict(status="TIMEOUT", surplus=1),
    ):
        with pytest.raises(ValidationError):
            _trace(**bad)
    with pytest.raises(ValidationError):  # custom inputs are all or nothing
        T.TraceWorkload(uuid="w", axes={}, inputs={"a": {"type": "custom"}, "b": {"type": "random"}})
    with pytest.raises(ValidationError):
        _trace(status="PASSED", correctness={"max_relative_error": -1.0}, performance=perf)


SOLUTIONS = [
    from_source("import torch\n\ndef run(x):\n    return x\n", "pytorch", "k.py"),
    from_source("import triton\nimport torch\n\ndef run(x):\n    return x\n", None, "k.py"),
    from_source("#include <torch/extension.h>\ntorch::Tensor run(torch::Tensor x) { return x; }\n", "cuda_cpp", "k.cu"),
    from_solution_json(
        json.dumps(
            {
                "name": "dps",
                "author": "me",
                "spec": {
                    "languages": ["cuda_cpp"],
                    "entry_point": "main.cu::run",
                    "destination_passing_style": True,
                    "binding": "torch",
                    "target_hardware": ["B200"],
                    "dependencies": ["cublas"],
                    "compile_options": {"cuda_cflags": ["-O3", "-std=c++17"], "ld_flags": ["-lcublas"]},
                },
                "sources": [
                    {"path": "main.cu", "content": "void run(torch::Tensor x, torch::Tensor y) {}\n"},
                    {"path": "inc/k.cuh", "content": "#pragma once\n"},
                ],
            }
        )
    ),
]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=["pytorch", "triton", "cuda", "dps-flags"])
def test_exported_solutions_load_back_unchanged(solution):
    sol = export_solution(solution, "c-123", "rmsnorm", "agent-a")
    text = sol.model_dump_json()
    SolSolution.model_validate_json(text)  # the published schema, strict
    back = from_solution_json(text)
    assert back.source_hash() == solution.source_hash()
    assert back.spec.model_dump() == solution.spec.model_dump()
    assert [s.model_dump() for s in back.sources] == [s.model_dump() for s in solution.sources]
    assert (back.name, back.definition, back.author) == ("c-123", "rmsnorm", "agent-a")


def test_published_solution_schema_refuses_what_its_loader_refuses():
    base = {
        "name": "n",
        "definition": "d",
        "author": "a",
        "spec": {"languages": ["triton"], "target_hardware": ["LOCAL"], "entry_point": "k.py::run"},
        "sources": [{"path": "k.py", "content": "x = 1\n"}],
    }
    SolSolution.model_validate(base)
    for change in (
        {"spec": {**base["spec"], "languages": ["triton", "cuda_cpp"]}},
        {"spec": {**base["spec"], "entry_point": "k.cu::run"}},
        {"spec": {**base["spec"], "target_hardware": []}},
        {"spec": {**base["spec"], "languages": ["tilelang"]}},
        {"sources": [{"path": "other.py", "content": "x = 1\n"}]},
        {"sources": [{"path": "../k.py", "content": "x = 1\n"}]},
        {"author": ""},
    ):
        with pytest.raises(ValidationError):
            SolSolution.model_validate({**base, **change})


WRONG = """import torch

def run(input):
    return torch.softmax(input, dim=-1) * 1.5
"""


def test_verdicts_export_as_traces_the_schema_accepts(tmp_path):
    g = make_guard(tmp_path / "ws", correctness_rounds=1, heldout_rounds=1)
    try:
        problem, _ = g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
        ref = problem.definition.reference
        good = g.evaluate(from_source(unique(ref), "pytorch", "kernel.py"), problem.name, agent="a")
        bad = g.evaluate(from_source(unique(WRONG), "pytorch", "kernel.py"), problem.name, agent="b")
        broken = g.evaluate(
            from_source(unique("def run(input):\n    return (\n"), "pytorch", "kernel.py"), problem.name, agent="b"
        )
        assert (good.status, bad.status) == ("PASSED", "INCORRECT_NUMERICAL")
        out = tmp_path / "export"
        summary = export_problem(g.db, g.store.get(problem.name), out, cpu_count=g.cfg.cpu_workloads)
    finally:
        g.close()
    assert summary.candidates == 3 and not summary.skipped
    traces = [T.Trace.model_validate_json(line) for line in (out / TRACES_FILE).read_text().splitlines()]
    n = len(good.workloads)
    assert len(traces) == 3 * n and summary.by_status["PASSED"] == n
    by = {}
    for t in traces:
        by.setdefault(t.solution, []).append(t)
    for t in by[good.candidate_id]:
        assert t.evaluation.status == "PASSED" and t.evaluation.performance.latency_ms > 0
        assert t.evaluation.performance.reference_latency_ms > 0
        assert t.evaluation.correctness.extra["kernelarc_tolerance"]["output"]["atol"] == 1e-4
    wrong = by[bad.candidate_id]
    assert {t.evaluation.status for t in wrong} == {"INCORRECT_NUMERICAL"}
    failed = [t for t in wrong if t.workload.uuid == bad.first_failing_workload]
    assert len(failed) == 1 and failed[0].evaluation.correctness.max_absolute_error > 0
    assert all(t.evaluation.correctness.extra.get("measured") is False for t in wrong if t not in failed)
    assert {t.evaluation.status for t in by[broken.candidate_id]} == {broken.status}
    assert all(t.evaluation.correctness is None for t in by[broken.candidate_id])
    # the folder is a SOL-ExecBench problem again, and its solutions load back here
    assert load_problem(out).definition.name == problem.name
    for cid in (good.candidate_id, bad.candidate_id):
        back = from_solution_json((out / "solutions" / f"{cid}.json").read_text())
        assert back.source_hash() == g.db.candidate(cid)["source_hash"]
    # the command line: show --trace and export
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["--workspace", str(tmp_path / "ws"), "show", good.candidate_id, "--trace"]) == 0
    lines = buf.getvalue().splitlines()
    assert len(lines) == n and all(T.Trace.model_validate_json(x).solution == good.candidate_id for x in lines)
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert (
            main(
                [
                    "--workspace",
                    str(tmp_path / "ws"),
                    "export",
                    "--problem",
                    problem.name,
                    "--format",
                    "sol-execbench",
                    "--out",
                    str(tmp_path / "cli"),
                    "--agent",
                    "a",
                    "--json",
                ]
            )
            == 0
        )
    assert json.loads(buf.getvalue().splitlines()[-1])["traces"] == n
