"""One run of a KernelBench file at given constants: its forward arguments, model state and
outputs (shapes and dtypes), on the meta device or for real on the CPU."""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ..kernelbench_consts import module_constants
from ..kernelbench_import import axes_adapter_source
from ..model_state import untied_state
from .failures import ProbeFailure, failure_reason, time_limit
from .meta_patches import patch_for_meta

# a forward argument (name, "tensor" or "scalar", shape or None, dtype, a scalar's value), a
# state_dict entry (key, shape, dtype) and an output ("tensor", shape, dtype)
ArgEntry = tuple[str, str, tuple[int, ...] | None, str, bool | int | float | None]
StateEntry = tuple[str, tuple[int, ...], str]
OutputEntry = tuple[str, tuple[int, ...] | None, str]
# names, kinds, ranks and dtypes (``Iface.structure``, ``Prober._structure``)
Structure = tuple[tuple[object, ...], ...]
# one dim of the interface: ("args" | "state" | "outputs", index, dim)
DimKey = tuple[str, int, int]
# what a dim is: a size, an axis, ("fit", axis) or ("expr", expression) over one axis, or
# ("multi", axes) when several axes move it
Symbol = int | str | tuple[Literal["fit", "expr"], str] | tuple[Literal["multi"], tuple[str, ...]]


class Iface:
    """Shapes and dtypes of a run: forward arguments, state_dict entries, outputs."""

    def __init__(self, args: list[ArgEntry], state: list[StateEntry], outputs: list[OutputEntry]):
        self.args = args  # [(name, kind, shape|None, dtype, value)]
        self.state = state  # [(key, shape, dtype)]
        self.outputs = outputs  # [(kind, shape|None, dtype)]
        self.flops: float | None = None  # of the forward, when counted
        self.has_outputs = True  # False: the forward was not run

    def structure(self) -> Structure:
        return (
            tuple((n, k, None if s is None else len(s), d) for n, k, s, d, _ in self.args),
            tuple((k, len(s), d) for k, s, d in self.state),
            tuple((k, None if s is None else len(s), d) for k, s, d in self.outputs),
        )

    def dims(self) -> dict[DimKey, int]:
        out: dict[DimKey, int] = {}
        for i, (_, kind, shape, _, _) in enumerate(self.args):
            for j, v in enumerate(shape or ()):
                out[("args", i, j)] = v
        for i, (_, shape, _) in enumerate(self.state):
            for j, v in enumerate(shape):
                out[("state", i, j)] = v
        for i, (_, shape, _) in enumerate(self.outputs):
            for j, v in enumerate(shape or ()):
                out[("outputs", i, j)] = v
        return out

    def largest(self) -> int:
        return max((math.prod(s) for s in self._shapes()), default=1)

    def _shapes(self) -> Iterator[tuple[int, ...]]:
        for _, kind, shape, _, _ in self.args:
            if shape is not None:
                yield shape
        for _, shape, _ in self.state:
            yield shape
        for _, shape, _ in self.outputs:
            if shape is not None:
                yield shape


def dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


class Prober:
    def __init__(self, path: str):
        import torch

        self.torch = torch
        patch_for_meta(torch)
        self.path = path
        self.source = Path(path).read_text()
        self.consts = module_constants(self.source)
        self.full = self.consts.values
        self.code = compile(self.source, path, "exec")
        self.ns: dict[str, Any] = {"__name__": "kernelbench_problem", "__file__": path}
        try:
            with torch.device("meta"):
                exec(self.code, self.ns)
        except BaseException as exc:  # noqa: BLE001 - any failure of the file's own code
            hint = ""
            if isinstance(exc, ModuleNotFoundError):
                hint = f" (install {exc.name!r} in the guard's environment)"
            raise ProbeFailure("executing the file", failure_reason(exc, path) + hint, exc) from None
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in self.ns]
        if missing:
            raise ProbeFailure("executing the file", f"it defines no {', '.join(missing)}")
        exec(compile(axes_adapter_source(self.consts), "<kernelarc adapter>", "exec"), self.ns)
        self.param_names = self._forward_names()
        self.runs = 0

    def _structure(self, args: list[Any], state: dict[str, Any]) -> Structure:
        torch = self.torch
        names = self._names(len(args))
        a: list[tuple[str, str, int | None, str]] = []
        for n, v in zip(names, args):
            if isinstance(v, torch.Tensor):
                a.append((n, "tensor", v.dim(), dtype_name(v)))
            else:
                a.append((n, "scalar", None, {bool: "bool", int: "int64", float: "float32"}.get(type(v), "?")))
        s = tuple((k, v.dim(), dtype_name(v)) for k, v in state.items() if isinstance(v, torch.Tensor))
        return (tuple(a), s)

    def _names(self, n: int) -> list[str]:
        names = list(self.param_names[:n])
        return names + [f"arg{i}" for i in range(len(names), n)]

    def _forward_names(self) -> list[str]:
        try:
            sig = inspect.signature(self.ns["Model"].forward)
        except (TypeError, ValueError):
            return []
        params = list(sig.parameters.values())[1:]  # drop self
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    # -- one run -------------------------------------------------------------------------
    def interface(
        self,
        axes: dict[str, int],
        mode: str,
        limit: float,
        structure: Structure | None = None,
        forward: bool = True,
        count_flops: bool = False,
    ) -> Iface:
        """Run at ``axes``: "meta" (all on meta), "cpu-init" (model built on the CPU, then
        moved to meta) or "cpu" (all real, on the CPU). With ``structure``, a run whose
        arguments or state differ from it in names, ranks or dtypes stops before forward
        (ProbeFailure with phase "structure")."""
        torch, ns = self.torch, self.ns
        self.runs += 1
        meta = contextlib.nullcontext() if mode == "cpu" else torch.device("meta")
        phase = "setting the constants"
        try:
            with time_limit(limit):
                ns["_ka_set_axes"](axes)
                torch.manual_seed(0)
                phase = "get_inputs()"
                with meta:
                    args = list(ns["get_inputs"]())
                phase = "get_init_inputs()"
                with meta:
                    init = list(ns["get_init_inputs"]())
                phase = "building the Model"
                if mode == "cpu-init":
                    model = ns["Model"](*init).to("meta")
                else:
                    with meta:
                        model = ns["Model"](*init)
                state = untied_state(model)
                if structure is not None:
                    seen = self._structure(args, state)
                    if seen != structure[:2]:
                        raise ProbeFailure("structure", "the forward arguments or the model's parameters change")
                flops = None
                if not forward:
                    out = []
                elif count_flops:
                    from torch.utils.flop_counter import FlopCounterMode

                    phase = "forward"
                    counter = FlopCounterMode(display=False)
                    with meta, torch.no_grad(), counter:
                        out = model(*args)
                    flops = counter.get_total_flops()
                else:
                    phase = "forward"
                    with meta, torch.no_grad():
                        out = model(*args)
        except ProbeFailure:
            raise
        except BaseException as exc:  # noqa: BLE001 - the file's own code, any failure
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ProbeFailure(phase, failure_reason(exc, self.path, limit), exc) from None
        names = self._names(len(args))
        a: list[ArgEntry] = []
        for n, v in zip(names, args):
            if isinstance(v, torch.Tensor):
                a.append((n, "tensor", tuple(v.shape), dtype_name(v), None))
            elif isinstance(v, bool):
                a.append((n, "scalar", None, "bool", v))
            elif isinstance(v, int):
                a.append((n, "scalar", None, "int64", v))
            elif isinstance(v, float):
                a.append((n, "scalar", None, "float32", v))
            else:
                raise ProbeFailure("get_inputs()", f"argument {n} is a {type(v).__name__}, not a tensor or number")
        s: list[StateEntry] = [
            (k, tuple(v.shape), dtype_name(v)) for k, v in state.items() if isinstance(v, torch.Tensor)
        ]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        o: list[OutputEntry] = []
        for i, v in enumerate(outs):
            if not isinstance(v, torch.Tensor):
                raise ProbeFailure("forward", f"output {i} is a {type(v).__name__}, not a tensor")
            o.append(("tensor", tuple(v.shape), dtype_name(v)))
        iface = Iface(a, s, o)
        iface.flops = flops
        iface.has_outputs = forward
        return iface
