"""The shipped seed problems (seeds/<name>/): well-formed definitions, real-model workloads,
seed kernels that pass the static screen, and references that run on the CPU on the derived
CPU workloads with finite outputs of the declared shapes and dtypes.

The seed kernels themselves are evaluated through the guard elsewhere (and on the GPU);
here only the problems and the seed files' form are checked, quickly."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch

from guard.candidates.load import from_source
from guard.problems.derive import workload_set
from guard.problems.problem import load_problem
from guard.runner.common import load_module_from_source, normalize_outputs
from guard.runner.inputs import InputMaker, torch_dtype
from guard.screen import screen_solution

from helpers import REPO

SEEDS = REPO / "seeds"
FOLDERS = sorted(p for p in SEEDS.iterdir() if (p / "definition.json").is_file())
SECRET = b"test-seeds-fixed-secret-32-bytes"
MAX_IO_BYTES = 2.2e9  # "about 2 GB" of inputs + outputs for the biggest visible workload


def ids(p: Path) -> str:
    return p.name


@pytest.fixture(scope="module", params=FOLDERS, ids=ids)
def problem(request):
    return load_problem(request.param, origin="seed")


def test_there_are_seed_problems():
    names = {p.name for p in FOLDERS}
    for family in (
        "matmul",
        "softmax",
        "layernorm",
        "rmsnorm",
        "attention",
        "swiglu_mlp",
        "cross_entropy",
        "rope",
        "reduce_sum",
        "attn_out_proj_residual",
    ):
        assert any(n.startswith(family + "_") for n in names), f"no seed problem for {family}"
    assert any(n.startswith(("decoder_block_", "moe_expert_")) for n in names)


def test_definition_and_workloads(problem):
    d, ka = problem.definition, problem.definition.kernelarc
    folder = problem.root
    assert d.name == folder.name
    assert ka.op_family, "kernelarc.op_family is not set"
    assert folder.name.startswith(ka.op_family + "_") or folder.name == ka.op_family
    assert ka.bound in ("memory", "compute", "mixed")
    assert ka.flops and ka.bytes, "FLOP and byte formulas are required"
    assert ka.models, "kernelarc.models must say where the shapes come from"
    assert d.description and len(d.description) > 40
    assert 8 <= len(problem.workloads) <= 16
    uuids = [w.uuid for w in problem.workloads]
    assert len(set(uuids)) == len(uuids)
    for w in problem.workloads:
        axes = d.resolve_axes(w.axes)
        flops, moved = d.flops(axes), d.bytes_moved(axes)
        assert flops is not None and flops > 0 and moved > 0
        # the fewest bytes cannot exceed reading every input and writing every output once
        assert moved <= d.io_bytes(axes) * 1.0001
        assert d.io_bytes(axes) <= MAX_IO_BYTES, f"{w.uuid}: {d.io_bytes(axes) / 1e9:.2f} GB"
    for dtype, tol in ka.tolerance.items():
        if max(tol.atol, tol.rtol) > 2e-2:
            assert "olerance" in d.description, f"{dtype} tolerance looser than 2e-2 needs a reason"
    if not ka.adversarial:
        assert "dversarial" in d.description, "say why adversarial rounds are off"
    if ka.heldout_axes is not None:
        assert set(ka.heldout_axes) <= set(d.var_axes)


def _run_params(source: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "run":
            return [a.arg for a in node.args.args]
    raise AssertionError("no def run(...)")


def test_seed_kernels_present_and_screened(problem):
    d = problem.definition
    seeds = problem.seed_kernels()
    assert {"seed_triton.py", "seed_cuda.cu"} <= set(seeds)
    triton_src = seeds["seed_triton.py"].read_text()
    cuda_src = seeds["seed_cuda.cu"].read_text()
    # same signature as the reference: the guard calls run(*inputs in definition order)
    assert _run_params(triton_src) == list(d.inputs) == _run_params(d.reference)
    assert "import triton" in triton_src and "triton.language" in triton_src
    m = re.search(r"^\S.*\brun\s*\(([^)]*)\)\s*\{", cuda_src, re.M)
    assert m, "seed_cuda.cu defines no host function run(...)"
    assert len([a for a in m.group(1).split(",") if a.strip()]) == len(d.inputs)
    assert "cublas" not in cuda_src.lower()
    for name, src, lang in (("seed_triton.py", triton_src, "triton"), ("seed_cuda.cu", cuda_src, "cuda_cpp")):
        result = screen_solution(from_source(src, lang, name), 256_000, 16)
        assert result.ok, result.message()


def test_references_run_on_cpu_workloads(problem, tmp_path):
    d = problem.definition
    module = load_module_from_source(d.reference, tmp_path / "ref", "reference")
    maker = InputMaker(d.model_dump(mode="json"), "cpu", module)
    ws = workload_set(problem, "cpu", SECRET)
    kinds = ["normal"] + (["large", "tiny"] if d.kernelarc.adversarial else [])
    names = list(d.outputs)
    for w in ws.visible + ws.heldout:
        axes = d.resolve_axes(w.axes)
        for kind in kinds:
            args = maker.make(w.model_dump(mode="json"), axes, 1234, kind)
            for name, spec, a in zip(d.inputs, d.inputs.values(), args):
                if spec.shape is not None:
                    assert tuple(a.shape) == d.shape_of(spec, axes), name
                    if a.dtype in (torch.int32, torch.int64) and a.numel():
                        # class indices must index the first float input's last dimension
                        assert int(a.min()) >= 0
            with torch.no_grad():
                outs = normalize_outputs(module.run(*args), names)
            for name, spec, out in zip(names, d.outputs.values(), outs):
                assert isinstance(out, torch.Tensor), name
                assert tuple(out.shape) == d.shape_of(spec, axes), f"{w.uuid} {name}"
                assert out.dtype == torch_dtype(spec.dtype), f"{w.uuid} {name}"
                if out.is_floating_point():
                    assert bool(torch.isfinite(out).all()), f"{w.uuid} {name} ({kind}) not finite"


def test_cpu_workloads_stay_small(problem):
    """Triton's interpreter runs every program in Python: CPU workloads must stay small."""
    d = problem.definition
    ws = workload_set(problem, "cpu", SECRET)
    assert 1 <= len(ws.visible) <= 4
    for w in ws.visible + ws.heldout:
        axes = d.resolve_axes(w.axes)
        largest = max(
            math.prod(d.shape_of(s, axes))
            for s in list(d.inputs.values()) + list(d.outputs.values())
            if s.shape is not None
        )
        assert largest <= 1 << 18, f"{w.uuid}: {largest} elements"
