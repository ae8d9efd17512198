"""What the trusted worker keeps between evaluations. On the H200 a worker judging KernelBench
problem after problem held 11-13 GiB of earlier problems' memory: every reference module
kept a second, device-resident copy of its model's weights (run() calls it with the weights
it is given), and every problem stayed loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from guard.problems.kernelbench_import import import_kernelbench_file  # noqa: E402
from guard.problems.schema import Definition  # noqa: E402
from guard.runner import trusted_role as tr  # noqa: E402
from guard.runner.common import load_module_from_source  # noqa: E402

DATA = Path(__file__).parent / "data" / "kernelbench"


def _reference(tmp_path: Path, name: str):
    problem, _ = import_kernelbench_file(DATA / name)
    d = problem.definition
    axes = d.resolve_axes(d.kernelarc.cpu_workloads[0].axes)
    return d, axes, load_module_from_source(d.reference, tmp_path / "ref", "reference")


def test_the_model_a_kernelbench_reference_calls_holds_no_weights(tmp_path):
    d, axes, module = _reference(tmp_path, "12_Gemm_GELU.py")
    values = module.generate_inputs(dict(axes), "cpu")
    args = [values[n] for n in d.inputs]
    kept = module.run(*args)  # the CPU's inputs came from a model kept for run()
    module._ka_models.clear()
    shell = module._ka_model("cpu")
    assert [p.device.type for p in shell.parameters()] == ["meta", "meta"]
    assert torch.equal(module.run(*args), kept)


SHELL_NEEDS_DEVICE = '''
import torch

class Model(torch.nn.Module):
    """A tensor attribute outside the state_dict: the shell is built on the device."""
    def __init__(self, n):
        super().__init__()
        self.linear = torch.nn.Linear(n, n)
        self.scale = torch.full((n,), 2.0)
        self.register_buffer("offset", torch.ones(n), persistent=False)

    def forward(self, x):
        return self.linear(x) * self.scale + self.offset

N = 8

def get_inputs():
    return [torch.randn(4, N)]

def get_init_inputs():
    return [N]
'''


def test_a_model_with_tensors_outside_its_state_dict_is_built_for_real(tmp_path):
    path = tmp_path / "scaled_linear.py"
    path.write_text(SHELL_NEEDS_DEVICE)
    problem, _ = import_kernelbench_file(path)
    d = problem.definition
    module = load_module_from_source(d.reference, tmp_path / "ref", "reference")
    values = module.generate_inputs(dict(d.resolve_axes(d.kernelarc.cpu_workloads[0].axes)), "cpu")
    args = [values[n] for n in d.inputs]
    kept = module.run(*args)
    module._ka_models.clear()
    model = module._ka_model("cpu")
    assert all(not p.is_meta for p in model.parameters())
    assert torch.equal(module.run(*args), kept)


def _copy_problem(n: int) -> Definition:
    return Definition.model_validate(
        {
            "name": f"copy{n}",
            "op_type": "copy",
            "reference": f"def run(x):\n    return x.clone() + {n}\n",
            "axes": {"n": {"type": "var"}},
            "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
            "outputs": {"y": {"shape": ["n"], "dtype": "float32"}},
        }
    )


def test_a_trusted_worker_keeps_only_its_most_recent_problems(tmp_path):
    role = tr.TrustedRole("cpu", tmp_path)
    defs = [_copy_problem(i) for i in range(4)]
    keys = [d.content_hash() for d in defs]

    def load(i: int) -> None:
        assert role.handle({"op": "problem", "key": keys[i], "definition": defs[i].to_json()})["ok"]

    def reference(i: int, tag: str) -> dict:
        w = {"uuid": "w", "axes": {"n": 16}, "inputs": {"x": {"type": "random"}}}
        msg = {"op": "reference", "key": keys[i], "workload": w, "axes": {"n": 16}}
        return role.handle({**msg, "rounds": [{"seed": 1, "kind": "normal", "tag": tag}]})

    load(0)
    assert reference(0, "a")["ok"] and "a" in role.refs
    first_module = role.problems[keys[0]][1].__name__
    assert first_module in sys.modules
    load(1)
    load(0)  # used again: the most recent
    load(2)
    assert list(role.problems) == [keys[0], keys[2]] and tr.KEPT_PROBLEMS == 2
    assert "a" in role.refs  # problem 0's reference is still held
    load(3)
    assert list(role.problems) == [keys[2], keys[3]]
    assert "a" not in role.refs and "a" not in role.ref_inputs  # let go with its problem
    assert first_module not in sys.modules  # and its module, with what its globals hold
    load(0)  # a problem asked for again loads again
    assert reference(0, "b")["ok"]
