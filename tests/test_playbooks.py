"""The long-term knowledge base (playbooks/methods/*.json) loads, validates and covers what the
decision policy needs: AutoKernel's six tiers, library/precision methods, and a repair method
for every failure class the guard reports."""

from __future__ import annotations

import json
from collections import Counter
from typing import get_args

import pytest

import playbooks
from memory.playbook import TIER_OF, Category, Method, Signal, load_methods

FAMILIES = {
    "rmsnorm",
    "layernorm",
    "softmax",
    "cross_entropy",
    "rope",
    "decoder_block",
    "attn_out_proj_residual",
    "swiglu_mlp",
    "matmul",
    "attention",
    "reduce",
    "elementwise",
}
FAILURE_SIGNALS = (
    "compile_error",
    "incorrect_numerical",
    "incorrect_shape",
    "incorrect_dtype",
    "runtime_error",
    "timeout",
    "nondeterministic",
    "reward_hack",
)
BACKENDS = {"triton", "cuda_cpp", "pytorch"}


@pytest.fixture(scope="module")
def methods() -> tuple[Method, ...]:
    return load_methods()


def test_loads_at_least_forty(methods):
    assert len(methods) >= 40, f"only {len(methods)} methods"


def test_ids_unique(methods):
    counts = Counter(m.id for m in methods)
    assert not [i for i, n in counts.items() if n > 1]


def test_every_file_is_a_methods_list():
    files = sorted(playbooks.METHODS_DIR.glob("*.json"))
    assert files, "no method files"
    for path in files:
        data = json.loads(path.read_text())
        assert set(data) == {"methods"}, f"{path.name}: top-level keys {sorted(data)}"
        assert isinstance(data["methods"], list) and data["methods"], f"{path.name}: empty"


def test_every_category_present(methods):
    present = {m.category for m in methods}
    missing = set(get_args(Category)) - present
    assert not missing, f"categories without methods: {sorted(missing)}"


def test_each_autokernel_tier_has_three(methods):
    per_tier = Counter(m.tier for m in methods if m.tier is not None)
    for tier in sorted(set(TIER_OF.values())):
        assert per_tier[tier] >= 3, f"tier {tier} has {per_tier[tier]} methods"


def test_families_are_known(methods):
    for m in methods:
        unknown = set(m.op_families) - FAMILIES
        assert not unknown, f"{m.id}: unknown op families {sorted(unknown)}"
        assert len(set(m.op_families)) == len(m.op_families), f"{m.id}: repeated family"


def test_signals_and_backends_not_repeated(methods):
    for m in methods:
        assert len(set(m.signals)) == len(m.signals), f"{m.id}: repeated signal"
        assert set(m.backends) <= BACKENDS and len(set(m.backends)) == len(m.backends)


@pytest.mark.parametrize("signal", FAILURE_SIGNALS)
def test_repair_method_for_each_failure(methods, signal):
    assert signal in get_args(Signal)
    assert any(m.category == "repair" and signal in m.signals for m in methods), f"no repair method answers {signal}"


def test_every_signal_is_answered(methods):
    answered = {s for m in methods for s in m.signals}
    missing = set(get_args(Signal)) - answered
    assert not missing, f"signals no method answers: {sorted(missing)}"


def test_how_to_per_backend(methods):
    for m in methods:
        if "triton" in m.backends:
            assert m.how_triton, f"{m.id}: lists triton but has no how_triton"
        if "cuda_cpp" in m.backends:
            assert m.how_cuda, f"{m.id}: lists cuda_cpp but has no how_cuda"


def test_methods_are_substantive(methods):
    for m in methods:
        assert m.name.strip(), m.id
        assert m.pitfalls, f"{m.id}: no pitfalls"
        assert all(p.strip() for p in m.pitfalls), f"{m.id}: blank pitfall"
        assert m.expected_gain, f"{m.id}: no expected_gain"
        assert m.architectures, f"{m.id}: no architectures"


def test_architecture_tier_targets_hopper(methods):
    tier5 = [m for m in methods if m.category == "architecture"]
    assert tier5 and all(m.architectures == ["sm_90"] for m in tier5)
