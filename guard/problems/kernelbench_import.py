"""Import a KernelBench problem file (``class Model``, ``get_inputs``, ``get_init_inputs``).

The model's parameters and buffers become explicit inputs of the problem, made by a
generated ``generate_inputs`` from the same seed for the reference and the candidate, so
both see identical weights. Module-level integer constants become axes: those whose halving
the model follows are var axes (the CPU and held-out workloads vary them), the others const.

The file is never run at its full size: a probe subprocess (``kernelbench_probe``) reads the
interface on torch's meta device, falls back to a reduced-size run on the CPU where meta
cannot serve, and runs the reference once on the CPU at the derived CPU workload.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..pyparse import parse
from .derive import CPU_ELEMENT_BUDGET, cpu_workloads
from .families import classify
from .kernelbench_consts import ModuleConstants, module_constants, set_axes_source
from .problem import Problem, ProblemError
from .schema import (
    Axis,
    ConstAxis,
    CustomInput,
    Definition,
    ExprAxis,
    KernelArcFields,
    TensorSpec,
    VarAxis,
    Workload,
)

BATCH_AXIS_NAMES = ("batch_size", "batch", "BATCH", "BATCH_SIZE", "B", "N")
META_RUN_LIMIT_S = 10.0  # one run on the meta device
CPU_RUN_LIMIT_S = 30.0  # one run on the CPU (reduced probe, CPU-workload check)
PROBE_TIMEOUT_S = 180.0  # the whole probe of one file


def syntax_error_message(path: Path, exc: SyntaxError) -> str:
    where = f"{path}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "")
    text = (exc.text or "").rstrip("\n")
    caret = ""
    if text and exc.offset:
        caret = "\n    " + " " * (exc.offset - 1 - (len(text) - len(text.lstrip()))) + "^"
    return f"{where}: syntax error: {exc.msg}" + (f"\n    {text.strip()}{caret}" if text else "")


def is_kernelbench_file(path: Path) -> bool:
    """A ``.py`` file defining ``Model``, ``get_inputs`` and ``get_init_inputs``. A ``.py``
    file that does not parse is reported (ProblemError with the line), not mistaken for
    another format."""
    if not (path.is_file() and path.suffix == ".py"):
        return False
    source = path.read_text()
    try:
        tree = parse(source, str(path))
    except SyntaxError as exc:
        raise ProblemError(syntax_error_message(path, exc)) from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    return {"Model", "get_inputs", "get_init_inputs"} <= defined


# --------------------------------------------------------------------------- the probe


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # interface only; the CPU is enough
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


class KernelBenchProber:
    """One probe subprocess (torch imported once) serving any number of files; each file is
    probed in a forked child with memory and time limits. A context manager."""

    def __init__(self, timeout: float = PROBE_TIMEOUT_S):
        self.timeout = timeout
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "guard.problems.kernelbench_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=_probe_env(),
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None  # both pipes
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout

    def probe(self, path: Path) -> dict[str, Any]:
        req = {"path": str(Path(path).resolve()), "timeout": self.timeout}
        try:
            self._stdin.write(json.dumps(req) + "\n")
            self._stdin.flush()
            line = self._stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise ProblemError(f"{path}: the probe process stopped: {self._stderr_tail() or 'no message'}")
        spec: dict[str, Any] = json.loads(line)
        return spec

    def _stderr_tail(self) -> str:
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return "\n".join(lines[-8:])

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> "KernelBenchProber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------ the problem


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name)
    if not base.isidentifier() or base in taken:
        base = f"p_{base}"
    while base in taken:
        base += "_"
    taken.add(base)
    return base


def build_problem(
    path: Path, source: str, consts: ModuleConstants, spec: dict[str, Any]
) -> tuple[Problem, list[tuple[str, str]]]:
    """The problem a probe's ``spec`` describes; also (input name, state_dict key) pairs."""
    taken: set[str] = set()
    inputs: dict[str, TensorSpec] = {}
    arg_names, state_pairs = [], []
    for a in spec["args"]:
        name = _ident(a["name"], taken)
        arg_names.append(name)
        inputs[name] = TensorSpec(shape=a["shape"] if a["kind"] == "tensor" else None, dtype=a["dtype"])
    for s in spec["state"]:
        name = _ident(s["name"].replace(".", "__"), taken)
        state_pairs.append((name, s["name"]))
        inputs[name] = TensorSpec(shape=s["shape"], dtype=s["dtype"])
    outputs = {}
    for i, o in enumerate(spec["outputs"]):
        outputs["output" if len(spec["outputs"]) == 1 else f"output{i}"] = TensorSpec(
            shape=o["shape"], dtype=o["dtype"]
        )
    axes: dict[str, Axis] = {}
    for a, info in spec["axes"].items():
        if info["type"] == "var":
            axes[a] = VarAxis()
        elif info["type"] == "expr":  # a constant that must equal another
            axes[a] = ExprAxis(expression=info["expression"])
        else:
            axes[a] = ConstAxis(value=info["value"])
    for a, expr in spec.get("exprs", {}).items():
        axes[a] = ExprAxis(expression=expr)
    var = [a for a, info in spec["axes"].items() if info["type"] == "var"]
    batch = [n for n in BATCH_AXIS_NAMES if n in var]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", path.stem)[:100]
    name = name if name[:1].isalnum() else f"kb_{name}"
    reference = source.rstrip() + "\n\n" + _adapter(consts, arg_names, state_pairs)
    definition = Definition(
        name=name,
        op_type=classify(path.stem),
        description=f"Imported from KernelBench file {path.name}",
        axes=axes,
        constraints=[f"{a} >= {v}" for a, v in spec.get("lower", {}).items() if a in var],
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        custom_inputs_entrypoint="generate_inputs",
        kernelarc=KernelArcFields(
            op_family=classify(path.stem, source[:2000]),
            heldout_axes=batch[:1],
            source={"format": "kernelbench", "path": str(path.resolve())},
            cpu_element_budget=_budget(spec.get("cpu_element_budget")),
            # as KernelBench judges: repeats within the tolerance, since the reference itself may
            # not repeat bitwise (cuDNN picks atomics for grouped transposed convolutions)
            deterministic=False,
        ),
    )
    workload = Workload(
        uuid="kernelbench-default",
        axes={a: spec["axes"][a]["value"] for a in var},
        inputs={k: CustomInput() for k in inputs},
    )
    return Problem(definition, [workload]), state_pairs


def _budget(budget: int | None) -> int | None:
    return None if budget is None or budget >= CPU_ELEMENT_BUDGET else int(budget)


def import_kernelbench_file(
    path: Path, prober: KernelBenchProber | None = None, report: dict[str, Any] | None = None
) -> tuple[Problem, list[str]]:
    """The problem a KernelBench file defines, and notes for the user. ``prober`` lets a
    caller importing many files share one probe process (torch imported once); ``report``,
    a dict, receives the probe's own figures (runs, timings, the CPU check)."""
    path = Path(path)
    source = path.read_text()
    try:
        parse(source, str(path))
    except SyntaxError as exc:
        raise ProblemError(syntax_error_message(path, exc)) from None
    consts = module_constants(source)
    if prober is None:
        with KernelBenchProber() as own:
            reply = own.probe(path)
    else:
        reply = prober.probe(path)
    if not reply.get("ok"):
        raise ProblemError(f"{path}: {reply.get('error') or 'the probe gave no reason'}")
    spec = reply["spec"]
    if report is not None:
        report.update({k: spec.get(k) for k in ("mode", "runs", "timings", "cpu_check", "cpu_attempts")})
    problem, state_pairs = build_problem(path, source, consts, spec)
    d = problem.definition
    # the CPU workload derived as for every problem, kept so that the guard evaluates the
    # one the probe ran (held-out CPU workloads are derived with the same budget and bounds)
    d.kernelarc.cpu_workloads = cpu_workloads(d, problem.workloads)
    var = [a for a in d.axes if isinstance(d.axes[a], VarAxis)]
    const = [a for a in d.axes if isinstance(d.axes[a], ConstAxis)]
    notes = list(spec.get("notes", []))
    notes.append(
        f"{len(state_pairs)} parameter/buffer tensor(s) became inputs: "
        + ", ".join(n for n, _ in state_pairs[:6])
        + (" ..." if len(state_pairs) > 6 else "")
    )
    notes.append(
        f"axes from module constants: {', '.join(var) or 'none'} vary"
        + (f"; fixed: {', '.join(const)}" if const else "")
    )
    for a, why in spec.get("fixed", {}).items():
        if "fails on the CPU" in why or "no simple formula" in why:
            notes.append(f"{a} stays at {spec['axes'][a]['value']}: {why}")
    for a, least in spec.get("lower", {}).items():
        notes.append(f"{a} is at least {least} in derived workloads: the model fails below")
    check = spec.get("cpu_check", {})
    if check.get("ok"):
        cpu = ", ".join(f"{k}={v}" for k, v in check["axes"].items())
        notes.append(
            f"CPU workload ({cpu or 'full size'}) checked: the reference ran on the CPU in "
            f"{check['seconds']:.2f} s, largest tensor {check['largest_elements']} elements"
        )
        if not check.get("deterministic", True):
            notes.append(
                "the reference gave different outputs on two runs with the same inputs "
                "(it draws random numbers or keeps state in forward): candidates cannot match it"
            )
    elif check.get("phase") in ("size", "compute"):
        notes.append(
            f"the CPU workload was not run at import: {check.get('reason')} (the model's sizes "
            "cannot shrink further); CPU evaluation of this problem will be slow"
        )
    else:
        notes.append(
            "the reference could not be run on the CPU at its CPU workload "
            f"({check.get('phase', '?')}: {check.get('reason', 'no reason')}); "
            "CPU evaluation of this problem will fail"
        )
    return problem, notes


# ----------------------------------------------------------------------- the adapter


def axes_adapter_source(consts: ModuleConstants) -> str:
    """The part of the adapter that sets the module constants (the probe runs it too)."""
    rows = "".join(f"    ({stmt!r}, {bound!r}),\n" for stmt, bound in consts.assignments)
    return (
        f"_KA_AXES = {[c.axis for c in consts.constants]!r}\n"
        "# module constants in source order: (statement, [(axis, global, element index)])\n"
        f"_KA_CONSTANTS = [\n{rows}]\n"
        "_ka_axes_key = None\n\n\n" + set_axes_source()
    )


def _adapter(consts: ModuleConstants, args: list[str], state: list[tuple[str, str]]) -> str:
    params = ", ".join(args + [p for p, _ in state])
    return f'''# ---- KernelArc adapter, generated by `kernelarc import` ----
import torch as _ka_torch

{axes_adapter_source(consts)}
_KA_ARGS = {args!r}
_KA_STATE = {state!r}
_ka_models = {{}}


def generate_inputs(axes_and_scalars, device):
    """Forward arguments from get_inputs(), weights from a freshly built Model, both made
    on ``device`` itself where the file's code allows (torch's default device): a full-size
    input is never built on the host first and then copied."""
    _ka_set_axes(axes_and_scalars)
    try:
        with _ka_torch.device(device):
            values, model = _ka_make()
    except (RuntimeError, NotImplementedError, TypeError):  # code that only runs on the CPU
        values, model = _ka_make()
    state = model.state_dict()
    out = {{}}
    for name, value in zip(_KA_ARGS, values):
        out[name] = value.to(device) if isinstance(value, _ka_torch.Tensor) else value
    for name, key in _KA_STATE:
        out[name] = state[key].detach().to(device)
    if str(device) == "cpu":  # run() on the CPU calls this model (its weights replaced)
        _ka_keep((_ka_axes_key, repr(get_init_inputs()), "cpu"), model)
    return out


def _ka_make():
    values = list(get_inputs())
    return values, Model(*get_init_inputs())


def _ka_keep(key, model):
    if len(_ka_models) >= 4:
        _ka_models.clear()
    _ka_models[key] = model


def _ka_model(device):
    key = (_ka_axes_key, repr(get_init_inputs()), str(device))
    if key not in _ka_models:  # its weights are replaced by run()'s
        _ka_keep(key, _ka_shell(device))
    return _ka_models[key]


def _ka_shell(device):
    """The Model that run() calls with its weights: on the meta device (no memory: a second copy
    of every weight stayed on the GPU beside the inputs) when every tensor it holds is in its
    state_dict, else built on ``device``."""
    try:
        with _ka_torch.device("meta"):
            shell = Model(*get_init_inputs())
        held = set(shell.state_dict())
        if all(n in held for n, _ in shell.named_parameters(remove_duplicate=False)) and all(
            n in held for n, _ in shell.named_buffers(remove_duplicate=False)
        ) and not any(isinstance(v, _ka_torch.Tensor) for m in shell.modules() for v in vars(m).values()):
            return shell
    except Exception:  # code the meta device cannot build: built as the file says below
        pass
    try:
        with _ka_torch.device(device):
            model = Model(*get_init_inputs())
    except (RuntimeError, NotImplementedError, TypeError):  # code that only runs on the CPU
        model = Model(*get_init_inputs())
    return model.to(device)


@_ka_torch.no_grad()
def run({params}):
    values = [{params}]
    forward_args = values[: len(_KA_ARGS)]
    device = next((v.device for v in values if isinstance(v, _ka_torch.Tensor)), "cpu")
    weights = {{key: v for (_, key), v in zip(_KA_STATE, values[len(_KA_ARGS):])}}
    return _ka_torch.func.functional_call(_ka_model(device), weights, tuple(forward_args))
'''
