"""Import a KernelBench problem file (``class Model``, ``get_inputs``, ``get_init_inputs``).

The model's parameters and buffers become explicit inputs of the problem, made by a
generated ``generate_inputs`` from the same seed for the reference and the candidate, so
both see identical weights. Module-level integer constants become axes.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from ..pyparse import parse
from .families import classify
from .problem import Problem, ProblemError
from .schema import CustomInput, Definition, KernelArcFields, TensorSpec, VarAxis, Workload

BATCH_AXIS_NAMES = ("batch_size", "batch", "BATCH", "BATCH_SIZE", "B", "N")


def is_kernelbench_file(path: Path) -> bool:
    if not (path.is_file() and path.suffix == ".py"):
        return False
    try:
        tree = parse(path.read_text())
    except SyntaxError:
        return False
    defined = {
        n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
    }
    return {"Model", "get_inputs", "get_init_inputs"} <= defined


def _cpu_candidates(consts: dict[str, int]) -> list[dict[str, int]]:
    batch = [n for n in BATCH_AXIS_NAMES if n in consts]
    cands = []
    for div in (8, 32):
        cands.append({k: (max(1, v // div) if v >= 16 else v) for k, v in consts.items()})
    if batch:
        cands.append({batch[0]: min(2, consts[batch[0]])})
    cands.append({})
    return cands


def _probe(path: Path, consts: dict[str, int]) -> dict:
    req = json.dumps({"path": str(path.resolve()), "cpu_axes_candidates": _cpu_candidates(consts)})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "guard.problems.kernelbench_probe"],
            input=req,
            capture_output=True,
            text=True,
            timeout=300,
            env=_probe_env(),
        )
    except subprocess.TimeoutExpired:
        raise ProblemError(f"{path}: running the model to read its interface took over 300 s") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise ProblemError(f"{path}: could not run the model on the CPU:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _probe_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # interface only; the CPU is enough
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _symbolic(shape: list[int], consts: dict[str, int]) -> list[str | int]:
    by_value: dict[int, str] = {}
    for name, value in consts.items():
        by_value.setdefault(value, name)
    return [by_value.get(d, d) for d in shape]


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name)
    if not base.isidentifier() or base in taken:
        base = f"p_{base}"
    while base in taken:
        base += "_"
    taken.add(base)
    return base


def import_kernelbench_file(path: Path) -> tuple[Problem, list[str]]:
    source = path.read_text()
    consts = {}
    from .kernelbench_probe import _int_constants

    consts = _int_constants(source)
    info = _probe(path, consts)
    taken: set[str] = set()
    inputs: dict[str, TensorSpec] = {}
    arg_names, state_pairs = [], []
    for a in info["args"]:
        name = _ident(a["name"], taken)
        arg_names.append(name)
        shape = _symbolic(a["shape"], consts) if a["kind"] == "tensor" else None
        inputs[name] = TensorSpec(shape=shape, dtype=a["dtype"])
    for s in info["state"]:
        name = _ident(s["name"].replace(".", "__"), taken)
        state_pairs.append((name, s["name"]))
        inputs[name] = TensorSpec(shape=_symbolic(s["shape"], consts), dtype=s["dtype"])
    outputs = {}
    for i, o in enumerate(info["outputs"]):
        if o["kind"] != "tensor":
            raise ProblemError(f"{path}: output {i} is not a tensor")
        outputs["output" if len(info["outputs"]) == 1 else f"output{i}"] = TensorSpec(
            shape=_symbolic(o["shape"], consts), dtype=o["dtype"]
        )
    batch = [n for n in BATCH_AXIS_NAMES if n in consts]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", path.stem)[:100]
    name = name if name[:1].isalnum() else f"kb_{name}"
    reference = source.rstrip() + "\n\n" + _adapter(consts, arg_names, state_pairs)
    cpu = [dict(consts, **c) for c in info["valid_cpu_axes"]][:2]
    definition = Definition(
        name=name,
        op_type=classify(path.stem),
        description=f"Imported from KernelBench file {path.name}",
        axes={k: VarAxis() for k in consts},
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        custom_inputs_entrypoint="generate_inputs",
        kernelarc=KernelArcFields(
            op_family=classify(path.stem, source[:2000]),
            heldout_axes=batch[:1],
            source={"format": "kernelbench", "path": str(path.resolve())},
            cpu_workloads=[
                Workload(uuid=f"cpu-{i}", axes=a, inputs={k: CustomInput() for k in inputs})
                for i, a in enumerate(cpu)
            ]
            or None,
        ),
    )
    workload = Workload(
        uuid="kernelbench-default", axes=dict(consts), inputs={k: CustomInput() for k in inputs}
    )
    notes = [
        f"{len(state_pairs)} parameter/buffer tensor(s) became inputs: "
        + ", ".join(n for n, _ in state_pairs[:6])
        + (" ..." if len(state_pairs) > 6 else ""),
        f"axes from module constants: {', '.join(consts) or 'none'}",
    ]
    if not cpu:
        notes.append("no smaller CPU shape ran; CPU evaluation uses the full shape")
    return Problem(definition, [workload]), notes


def _adapter(consts: dict[str, int], args: list[str], state: list[tuple[str, str]]) -> str:
    params = ", ".join(args + [p for p, _ in state])
    return f'''# ---- KernelArc adapter, generated by `kernelarc import` ----
import torch as _ka_torch

_KA_AXES = {list(consts)!r}
_KA_ARGS = {args!r}
_KA_STATE = {state!r}
_ka_models = {{}}


def _ka_set_axes(axes):
    g = globals()
    for k in _KA_AXES:
        if k in axes:
            g[k] = int(axes[k])


def generate_inputs(axes_and_scalars, device):
    """Forward arguments from get_inputs(), weights from a freshly built Model."""
    _ka_set_axes(axes_and_scalars)
    values = list(get_inputs())
    model = Model(*get_init_inputs())
    state = model.state_dict()
    out = {{}}
    for name, value in zip(_KA_ARGS, values):
        out[name] = value.to(device) if isinstance(value, _ka_torch.Tensor) else value
    for name, key in _KA_STATE:
        out[name] = state[key].detach().to(device)
    return out


def _ka_model(device):
    key = (repr(get_init_inputs()), str(device))
    if key not in _ka_models:
        _ka_models[key] = Model(*get_init_inputs()).to(device)
    return _ka_models[key]


@_ka_torch.no_grad()
def run({params}):
    values = [{params}]
    forward_args = values[: len(_KA_ARGS)]
    device = next((v.device for v in values if isinstance(v, _ka_torch.Tensor)), "cpu")
    weights = {{key: v for (_, key), v in zip(_KA_STATE, values[len(_KA_ARGS):])}}
    return _ka_torch.func.functional_call(_ka_model(device), weights, tuple(forward_args))
'''
