"""Fidelity to SOL-ExecBench's schema: the workload's tolerance spec (required_matched_ratio,
max_error_cap) is honoured; where KernelArc's checks are stricter the reason names the check;
an imported problem says field by field what it does not honour."""

from __future__ import annotations

import json
import math

import pytest
import torch

from guard.candidates.load import from_source
from guard.cascade.correctness_gate import merge_errors, named_checks
from guard.problems import tolerance as tol_mod
from guard.problems.problem import load_problem, read_jsonl, write_jsonl
from guard.problems.schema import Definition, Workload
from guard.problems.sol_fidelity import problem_notes
from guard.problems.sol_import import import_sol_folder
from guard.problems.summary import summarize
from guard.runner import messages as m
from guard.runner.compare import OUTLIER_FACTOR, compare, spec_args

from helpers import SOL_EXAMPLES, make_guard, unique


def _rounded(ref: torch.Tensor, every: int, factor: float, atol: float, rtol: float) -> torch.Tensor:
    """``ref`` with every ``every``-th element off by ``factor`` times its allowance."""
    out = ref.clone()
    flat = out.view(-1)
    flat[::every] += factor * (atol + rtol * flat[::every].abs())
    return out


def test_matched_ratio_lets_rounding_through_and_nothing_more():
    torch.manual_seed(0)
    ref = torch.randn(64, 1000)
    out = _rounded(ref, 150, 3.0, 1e-3, 1e-3)  # 427 of 64000 elements: 0.67%
    strict = compare(out, ref, 1e-3, 1e-3, "y")
    assert not strict["ok"] and strict["mismatches"] == math.ceil(64000 / 150)
    ok = compare(out, ref, 1e-3, 1e-3, "y", matched_ratio=0.99)
    assert ok["ok"] and ok["within_ratio"] and 2.9 < ok["outlier_factor"] < 3.1
    tight = compare(out, ref, 1e-3, 1e-3, "y", matched_ratio=0.995)
    assert not tight["ok"]
    assert "more than the 320 that required_matched_ratio=0.995 allows" in tight["message"]


def test_outlier_bound_is_named_when_it_is_stricter_than_sol_execbench():
    torch.manual_seed(1)
    ref = torch.randn(64, 1000) + 3.0
    tail = ref.clone()
    tail[:, -1] = 0.0  # an unmasked last column: 0.1% of the elements, off by their whole size
    rep = compare(tail, ref, 1e-2, 1e-2, "y", matched_ratio=0.99)
    assert not rep["ok"] and rep["status"] == "INCORRECT_NUMERICAL"
    assert rep["message"].startswith("y: KernelArc's outlier bound, stricter than SOL-ExecBench")
    assert "64 elements" in rep["message"] and rep["outlier_factor"] > OUTLIER_FACTOR


def test_error_cap_and_non_finite_values_fail_within_the_ratio():
    torch.manual_seed(2)
    ref = torch.randn(32, 100)
    out = _rounded(ref, 200, 2.0, 1e-2, 1e-2)
    assert compare(out, ref, 1e-2, 1e-2, "y", matched_ratio=0.99)["ok"]
    capped = compare(out, ref, 1e-2, 1e-2, "y", matched_ratio=0.99, error_cap=0.02)
    assert not capped["ok"] and "max_error_cap=0.02" in capped["message"]
    nan = ref.clone()
    nan[3, 7] = math.nan
    rep = compare(nan, ref, 1e-2, 1e-2, "y", matched_ratio=0.99)
    assert not rep["ok"] and "never a non-finite value" in rep["message"]
    strict = compare(nan, ref, 1e-2, 1e-2, "y")
    assert not strict["ok"] and strict["nan"] == 1 and strict["inf"] == 0
    folded: dict = {}
    merge_errors(folded, [strict, compare(out, ref, 1e-2, 1e-2, "y", matched_ratio=0.99)])
    assert folded["has_nan"] and folded["mismatches"] == math.ceil(3200 / 200)
    assert folded["max_abs"] == pytest.approx(max(strict["max_abs"], float((out - ref).abs().max())))
    ints = torch.arange(1000)
    off = ints.clone()
    off[5] += 1
    assert not compare(off, ints, 1e-2, 1e-2, "i", matched_ratio=0.99)["ok"]  # integers: exact
    assert spec_args({"atol": 1, "rtol": 1}) == {"matched_ratio": 1.0, "error_cap": None}
    assert spec_args({"required_matched_ratio": 0.9, "max_error_cap": 2.0}) == {"matched_ratio": 0.9, "error_cap": 2.0}


def _definition(out_dtype: str = "bfloat16", **ka) -> Definition:
    return Definition.model_validate(
        dict(
            name="t",
            axes={"n": {"type": "var"}},
            inputs={"x": {"shape": ["n"], "dtype": "bfloat16"}},
            outputs={"y": {"shape": ["n"], "dtype": out_dtype}},
            reference="def run(x):\n    return x\n",
            kernelarc=ka,
        )
    )


def test_tolerance_comes_from_the_workload_else_sol_defaults_with_our_dtype_bounds():
    spec = {"max_atol": 1e-3, "max_rtol": 2e-3, "required_matched_ratio": 0.95, "max_error_cap": 0.5}
    w = Workload(uuid="a", axes={"n": 4}, tolerance=spec)
    t = tol_mod.for_output(_definition("float32"), w, "float32")
    assert (t.atol, t.rtol, t.required_matched_ratio, t.max_error_cap, t.origin) == (1e-3, 2e-3, 0.95, 0.5, "workload")
    assert t.stricter is None
    bare = Workload(uuid="b", axes={"n": 4})
    bf16 = tol_mod.for_output(_definition(), bare, "bfloat16")
    assert (bf16.atol, bf16.rtol, bf16.required_matched_ratio, bf16.stricter) == (1e-2, 1e-2, 0.99, None)
    f32 = tol_mod.for_output(_definition("float32"), bare, "float32")
    assert f32.atol == 1e-4 and f32.required_matched_ratio == 1.0  # a 1e-2 ratio does not carry over
    assert "stricter than SOL-ExecBench's default 0.01" in f32.stricter and "every element" in f32.stricter
    fp8 = tol_mod.for_output(_definition("float8_e4m3fn"), bare, "float8_e4m3fn")
    assert fp8.required_matched_ratio == 0.99 and fp8.stricter is None
    own = tol_mod.for_output(
        _definition("float32", tolerance={"float32": {"atol": 1e-3, "rtol": 1e-3}}), bare, "float32"
    )
    assert own.origin == "kernelarc" and own.stricter.startswith("this problem's float32 tolerance")
    assert "match exactly" in tol_mod.for_output(_definition("int32"), bare, "int32").stricter
    assert tol_mod.view(_definition(), [w]) == {
        "y": {"atol": 1e-3, "rtol": 2e-3, "required_matched_ratio": 0.95, "max_error_cap": 0.5}
    }


def test_workload_tolerance_validates_and_round_trips(tmp_path):
    w = Workload.model_validate(
        {"uuid": "a", "axes": {}, "inputs": {}, "tolerance": {"max_atol": 1e-3, "required_matched_ratio": 0.9}}
    )
    assert w.tolerance.max_rtol == 1e-2 and w.tolerance.max_error_cap is None
    with pytest.raises(ValueError):
        Workload.model_validate({"uuid": "a", "tolerance": {"required_matched_ratio": 1.5}})
    write_jsonl(tmp_path / "w.jsonl", [w, Workload(uuid="b")])
    back = read_jsonl(tmp_path / "w.jsonl")
    assert back[0].tolerance == w.tolerance and back[1].tolerance is None
    assert "tolerance" not in json.loads((tmp_path / "w.jsonl").read_text().splitlines()[1])


def test_a_failure_names_the_stricter_checks_that_took_part():
    bare = Workload(uuid="b", axes={"n": 4})
    f32 = list(tol_mod.for_workload(_definition("float32"), bare).values())
    cmp = m.CompareReply(ok=True, status="INCORRECT_NUMERICAL", reports=[{"ok": False}])
    msg = named_checks("y: 3 of 4 elements outside", cmp, "tiny", f32)
    assert msg.startswith("[KernelArc's near-zero round, stricter than SOL-ExecBench")
    assert "[KernelArc's default float32 tolerance atol=0.0001" in msg and msg.endswith("y: 3 of 4 elements outside")
    bf16 = list(tol_mod.for_workload(_definition(), bare).values())
    assert named_checks("m", cmp, "normal", bf16) == "m"  # nothing stricter: the message alone


def test_imported_problem_says_what_it_does_not_honour(tmp_path):
    gqa, notes = import_sol_folder(SOL_EXAMPLES / "gqa_paged_decode_h32_kv8_d128_ps1")
    fields = [n.field for n in problem_notes(gqa)]
    assert "workload.tolerance.allow_negative_inf" in fields
    assert "solution.spec.target_hardware" in fields and "solution.spec.languages" in fields
    assert any("allow_negative_inf" in n for n in notes)
    gemm, _ = import_sol_folder(SOL_EXAMPLES / "gemm_n4096_k4096")
    assert [n.field for n in problem_notes(gemm, include_solution=False)] == ["workload.tolerance (output C)"]
    # an unknown definition field and the informational hf_id
    src = SOL_EXAMPLES / "rmsnorm_h4096"
    d = json.loads((src / "definition.json").read_text())
    d.update(hf_id="org/model", future_field=1)
    (tmp_path / "definition.json").write_text(json.dumps(d))
    (tmp_path / "workload.jsonl").write_text((src / "workload.jsonl").read_text())
    p = load_problem(tmp_path)
    got = {n.field: n.support for n in problem_notes(p, include_solution=False)}
    assert got == {"definition.future_field": "ignored", "definition.hf_id": "informational"}
    assert summarize(p)["not_honoured"][0].startswith("definition.future_field: ignored")


DOUBLE = """import torch

def run(x):
    return x * 2.0
"""

# 3x off its allowance on every 150th element, within the ratio and the outlier bound: the
# allowance's atol is held to the output's size (10 x rtol x its RMS, ``held_atol``), which
# the near-zero round's outputs (2**-40) fall far below
ROUNDED = """import torch

def run(x):
    y = x * 2.0
    flat = y.view(-1)
    atol = min(1e-3, 1e-2 * float(flat.pow(2).mean().sqrt()))
    flat[::150] += 3.0 * (atol + 1e-3 * flat[::150].abs())
    return y
"""

TAIL = """import torch

def run(x):
    y = x * 2.0
    y[:, -1] = 0.0
    return y
"""


def test_guard_honours_the_matched_ratio_end_to_end(tmp_path):
    folder = tmp_path / "double_rows"
    folder.mkdir()
    (folder / "definition.json").write_text(
        json.dumps(
            {
                "name": "double_rows",
                "axes": {"n": {"type": "var"}, "h": {"type": "const", "value": 1000}},
                "inputs": {"x": {"shape": ["n", "h"], "dtype": "float32"}},
                "outputs": {"y": {"shape": ["n", "h"], "dtype": "float32"}},
                "reference": DOUBLE,
                "kernelarc": {"heldout_count": 1},
            }
        )
    )
    tol = {"max_atol": 1e-3, "max_rtol": 1e-3, "required_matched_ratio": 0.99}
    (folder / "workload.jsonl").write_text(
        "\n".join(
            json.dumps({"uuid": f"w{n}", "axes": {"n": n}, "inputs": {"x": {"type": "random"}}, "tolerance": tol})
            for n in (16, 33)
        )
        + "\n"
    )
    g = make_guard(tmp_path / "ws", correctness_rounds=1, heldout_rounds=1)
    try:
        g.store.import_path(folder)
        v = g.evaluate(from_source(unique(ROUNDED), "pytorch", "kernel.py"), "double_rows", agent="a")
        assert v.status == "PASSED", v.reason
        assert all(e["mismatches"] > 0 for e in v.checked.errors.values())
        bad = g.evaluate(from_source(unique(TAIL), "pytorch", "kernel.py"), "double_rows", agent="a")
        assert bad.decision == "REJECT" and bad.status == "INCORRECT_NUMERICAL"
        assert "KernelArc's outlier bound, stricter than SOL-ExecBench" in bad.reason
        assert bad.checked.errors[bad.first_failing_workload]["max_abs"] > 0
    finally:
        g.close()
