"""Profiling a model on the CPU and writing its top kernels as problems."""

from __future__ import annotations

import json

import pytest
import torch

from wholemodel.loader import load
from wholemodel.problems import plan, write_problems
from wholemodel.profile import profile_model

from helpers import DATA

MODELS = DATA / "wholemodel"


@pytest.fixture(scope="module")
def llama():
    lm = load("llama_block", device="cpu")
    return lm, profile_model(lm, reps=2, warmup=1)


def _site_entries(profile, family):
    return [e for e in profile.entries if e.family == family and e.pluggable]


def test_llama_block_families_shapes_and_calls(llama):
    lm, prof = llama
    assert lm.name == "llama_block_small" and prof.dtype == "float32"
    families = {f for f, _, _ in prof.by_family()}
    assert {"matmul", "swiglu_mlp", "attention", "rmsnorm", "rope"} <= families
    (norm,) = _site_entries(prof, "rmsnorm")
    assert norm.axes == {"num_tokens": 32, "hidden_size": 256} and norm.calls == 2
    assert sorted(norm.modules) == ["attn_norm", "mlp_norm"] and norm.constants == {"eps": 1e-5}
    (mlp,) = _site_entries(prof, "swiglu_mlp")
    assert mlp.axes == {"num_tokens": 32, "hidden_size": 256, "intermediate_size": 688}
    # the gate and up projections belong to the SwiGLU kernel, the down projection is a matmul
    matmuls = {(e.axes["N"], e.axes["K"]): sorted(e.modules) for e in _site_entries(prof, "matmul")}
    assert matmuls == {
        (256, 256): ["attn.o_proj", "attn.q_proj"],
        (64, 256): ["attn.k_proj", "attn.v_proj"],
        (256, 688): ["mlp.down_proj"],
    }
    # rope runs on q (8 heads) and k (2 heads): two shapes of one site
    assert sorted(e.axes["num_heads"] for e in _site_entries(prof, "rope")) == [2, 8]
    (attn,) = _site_entries(prof, "attention")
    assert attn.axes == {"batch_size": 1, "seq_len": 32, "num_kv_heads": 2, "gqa_group": 4, "head_dim": 32}


def test_shares_ranking_and_amdahl(llama):
    _, prof = llama
    assert sum(e.share for e in prof.entries) == pytest.approx(1.0)
    times = [e.time_ms for e in prof.entries]
    assert times == sorted(times, reverse=True) and times[0] > 0
    top = prof.entries[0]
    for f in (1.5, 2.0, 3.0):
        assert top.amdahl(f) == pytest.approx(1.0 / ((1 - top.share) + top.share / f))
        assert 1.0 < top.amdahl(f) < f
    doc = prof.to_json()
    assert json.loads(json.dumps(doc))["entries"][0]["amdahl"]["x2"] == pytest.approx(top.amdahl(2.0))


def test_gpt2_block_layernorm_and_unsited_gelu():
    lm = load("gpt2_block:small", device="cpu")
    prof = profile_model(lm, reps=1, warmup=1)
    (ln,) = _site_entries(prof, "layernorm")
    assert ln.axes == {"num_tokens": 32, "hidden_size": 128} and ln.scalars == {"eps": 1e-5}
    (attn,) = _site_entries(prof, "attention")
    assert attn.axes["gqa_group"] == 1 and attn.axes["num_kv_heads"] == 4
    gelu = [e for e in prof.entries if e.where == "GELUMLP"]
    assert gelu and not gelu[0].pluggable  # listed, and marked as having no kernel site


def test_model_file_and_unknown_ops_listed():
    lm = load(str(MODELS / "custom_model.py"), device="cpu")
    prof = profile_model(lm, reps=2, warmup=1)
    other = [e for e in prof.entries if e.family == "other"]
    assert any(e.where == "aten::cummax" for e in other), [(e.family, e.where) for e in prof.entries]
    (norm,) = _site_entries(prof, "rmsnorm")
    assert norm.constants == {"eps": 1e-6} and norm.axes == {"num_tokens": 32, "hidden_size": 64}


def test_model_file_contract_errors(tmp_path):
    with pytest.raises(ValueError, match="example_inputs"):
        load(str(MODELS / "no_inputs_model.py"), device="cpu")
    with pytest.raises(ValueError, match="not a built-in model"):
        load(str(tmp_path / "missing.py"), device="cpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        load("llama_block", device="cpu", dtype="float13")


def test_top_k_problems_take_the_model_semantics(tmp_path, llama):
    """Each written problem's reference, run on the inputs the site saw, gives what the
    model's module gave: the problem is the model's op, not just its shapes."""
    lm, prof = llama
    planned, skipped = plan(prof, top=len(prof.entries))
    assert {p.family for p in planned} == {"matmul", "swiglu_mlp", "attention", "rmsnorm", "rope"}
    folders, _ = write_problems(prof, top=len(prof.entries), out_dir=tmp_path)
    from guard.problems.problem import load_problem

    problems = {load_problem(f).definition.kernelarc.op_family: load_problem(f) for f in folders}
    norm = problems["rmsnorm"]
    d = norm.definition
    assert d.name == "llama_block_small_rmsnorm" and d.axes["hidden_size"].value == 256
    assert d.inputs["hidden_states"].dtype == "float32"
    assert [w.axes for w in norm.workloads] == [{"num_tokens": 32}]
    assert d.kernelarc.bytes.endswith("* 4 / 2")  # float32 elements, not the template's bf16
    assert {w.axes["M"] for w in problems["matmul"].workloads} == {32}
    assert len(problems["matmul"].workloads) == 3 and len(problems["rope"].workloads) == 2

    scope: dict = {}
    exec(d.reference, scope)
    module = lm.model.attn_norm
    x = torch.randn(5, 256)
    assert torch.equal(scope["run"](x, module.weight.detach()), module(x))


def test_top_k_counts_only_pluggable_kernels_and_eps_reaches_the_reference(tmp_path):
    lm = load(str(MODELS / "custom_model.py"), device="cpu")
    prof = profile_model(lm, reps=1, warmup=1)
    planned, skipped = plan(prof, top=1)
    assert len(planned) == 1 and len(planned[0].entries) == 1
    assert all(not e.pluggable for e in skipped)
    folders, _ = write_problems(prof, top=2, out_dir=tmp_path, prefix="tiny")
    from guard.problems.problem import load_problem

    names = sorted(load_problem(f).name for f in folders)
    assert names == ["tiny_matmul", "tiny_rmsnorm"]
    ref = load_problem(tmp_path / "tiny_rmsnorm").definition.reference
    assert "1e-06" in ref and "1e-5" not in ref
