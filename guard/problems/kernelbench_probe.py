"""Run in a subprocess by the KernelBench importer: execute the file, report its interface.

Prints one JSON object on stdout. Needs torch; never imported by the server.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
import time

from ..pyparse import parse


def _int_constants(source: str) -> dict[str, int]:
    consts: dict[str, int] = {}
    for node in parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                try:  # simple products like 1024 * 2
                    value = eval(compile(ast.Expression(node.value), "<c>", "eval"), {"__builtins__": {}})
                except Exception:
                    continue
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                consts[node.targets[0].id] = value
    return consts


def _describe(value, torch):
    if isinstance(value, torch.Tensor):
        return {"kind": "tensor", "shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, bool):
        return {"kind": "scalar", "dtype": "bool", "value": value}
    if isinstance(value, int):
        return {"kind": "scalar", "dtype": "int64", "value": value}
    if isinstance(value, float):
        return {"kind": "scalar", "dtype": "float32", "value": value}
    raise TypeError(f"unsupported input type {type(value).__name__}")


def probe(path: str, cpu_axes_candidates: list[dict[str, int]]) -> dict:
    import torch

    source = open(path).read()
    consts = _int_constants(source)
    ns: dict = {"__name__": "kernelbench_problem"}
    exec(compile(source, path, "exec"), ns)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in ns:
            raise SystemExit(f"missing {name}")
    torch.manual_seed(0)
    args = list(ns["get_inputs"]())
    init = list(ns["get_init_inputs"]())
    model = ns["Model"](*init)
    params = [p for p in inspect.signature(model.forward).parameters.values()]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < len(args):
        names += [f"arg{i}" for i in range(len(names), len(args))]
    state = model.state_dict()
    with torch.no_grad():
        out = model(*args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    # Which shrunk axis sets still run on the CPU (the importer proposes them).
    valid_cpu = []
    for axes in cpu_axes_candidates:
        g = dict(ns)
        g.update(axes)
        try:
            exec("torch.manual_seed(0)", g)
            a = list(eval("get_inputs()", g))
            m = eval("Model(*get_init_inputs())", g)
            t0 = time.perf_counter()
            with torch.no_grad():
                m(*a)
            if time.perf_counter() - t0 < 2.0:
                valid_cpu.append(axes)
        except Exception:
            continue
    return {
        "constants": consts,
        "args": [dict(_describe(v, torch), name=n) for n, v in zip(names, args)],
        "init": [repr(v) for v in init],
        "state": [
            {"name": k, "shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
            for k, v in state.items()
        ],
        "outputs": [_describe(o, torch) for o in outs],
        "valid_cpu_axes": valid_cpu,
    }


if __name__ == "__main__":
    req = json.loads(sys.stdin.read())
    print(json.dumps(probe(req["path"], req["cpu_axes_candidates"])))
