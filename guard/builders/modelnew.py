"""KernelBench candidates as KernelBench writes them: a module defining ``class ModelNew``
(an ``nn.Module`` taking the ``Model``'s constructor arguments, its forward in PyTorch,
Triton or ``load_inline`` C++/CUDA), judged as a ``run(...)`` with the problem's inputs.

Runs in the candidate worker only. The candidate's file is imported as written; the adapter
is this module, not a source of the candidate's, so the archive shows the file as submitted.
What it needs of the problem comes from the reference module the worker loaded to make the
inputs (the adapter ``kernelarc import`` generated: ``get_init_inputs``, ``Model``, ``_KA_ARGS``
and ``_KA_STATE``, the pairs (input name, state_dict key)), never from the solution.

- ``ModelNew(*get_init_inputs())`` is built once per set of constructor arguments and device,
  the arguments read as the reference's ``run`` reads them: the module constants with the
  workload's axes applied by the last ``generate_inputs`` (the inputs of the call).
- The weights the problem passes as inputs go to ModelNew's parameters and buffers of the
  same state_dict name and shape; where names differ, the remaining ones are matched by
  shape (in registration order when both lists line up, else where a shape is unique).
  Parameters are bound for the call with ``torch.func.functional_call`` (no copy, as the
  reference's ``run`` does), and the module's own are dropped before it moves to the device
  (``drop_bound_parameters``); buffers are copied into the module's own, so a BatchNorm in
  training mode updates its running statistics there, never in an input.
- The call runs ModelNew's forward on the forward arguments under ``torch.no_grad``.

At build time the constructor and forward signatures are checked against the Model's
arguments, and the weight mapping against a ModelNew and a Model built on the meta device
at the file's own sizes, so a mismatch is a COMPILE_ERROR naming what to change.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..problems.model_state import untied_state
from .base import BuildError

REFERENCE_ATTRS = ("_KA_ARGS", "_KA_STATE", "get_init_inputs", "Model", "generate_inputs")
MAX_MODELS = 4


class WeightMismatch(ValueError):
    """ModelNew's parameters and buffers do not take the Model's weights."""


def kernelbench_reference(srcdir: Path) -> ModuleType | None:
    """The KernelBench reference module this worker loaded to make inputs, or None (the
    problem was not imported from KernelBench)."""
    found = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("reference_") and all(hasattr(m, a) for a in REFERENCE_ATTRS)
    ]
    if len(found) > 1:  # one per worker; prefer the one beside the candidate's sources
        here = [m for m in found if Path(getattr(m, "__file__", "") or "/").parent == srcdir.parent / "ref"]
        found = here or found
    return found[0] if found else None


def _describe_init(ref: ModuleType, init: list[Any]) -> str:
    try:
        bound = inspect.signature(ref.Model).bind(*init)
        return ", ".join(f"{k}={v!r}" for k, v in bound.arguments.items()) or "no arguments"
    except (TypeError, ValueError):
        return ", ".join(repr(v) for v in init) or "no arguments"


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(?)"


def match_weights(ref_state: list[tuple[str, tuple[int, ...]]], new_module: Any) -> dict[str, tuple[str, bool]]:
    """For each Model state_dict key (with its shape), the ModelNew state_dict key that takes
    it and whether that is a parameter. Raises WeightMismatch naming the unmatched ones."""
    # a tied parameter is one input, under its first name (``model_state.untied_state``)
    params = {k for k, _ in new_module.named_parameters()}
    new_state = {k: tuple(v.shape) for k, v in untied_state(new_module).items()}
    out: dict[str, tuple[str, bool]] = {}
    for key, shape in ref_state:  # the same name and shape
        if new_state.get(key) == shape:
            out[key] = (key, key in params)
    rest_ref = [(k, s) for k, s in ref_state if k not in out]
    taken = {v for v, _ in out.values()}
    rest_new = [(k, s) for k, s in new_state.items() if k not in taken]
    if rest_ref and len(rest_ref) == len(rest_new) and all(a[1] == b[1] for a, b in zip(rest_ref, rest_new)):
        for (rk, _), (nk, _) in zip(rest_ref, rest_new):  # renamed, registered in the same order
            out[rk] = (nk, nk in params)
    else:
        for rk, shape in rest_ref:  # renamed: a shape only one of each has left
            same_ref = [k for k, s in rest_ref if s == shape]
            same_new = [k for k, s in rest_new if s == shape]
            if len(same_ref) == 1 and len(same_new) == 1:
                out[rk] = (same_new[0], same_new[0] in params)
    taken = {v for v, _ in out.values()}
    missing = [(k, s) for k, s in ref_state if k not in out]
    extra = [(k, s) for k, s in new_state.items() if k not in taken and k in params]
    if missing or extra:

        def fmt(items: list[tuple[str, tuple[int, ...]]]) -> str:
            return ", ".join(f"{k} {list(s)}" for k, s in items)

        parts = []
        if missing:
            parts.append(
                f"the Model's weight(s) {fmt(missing)} match no parameter or buffer of ModelNew by name and shape"
            )
        if extra:
            parts.append(
                f"ModelNew's parameter(s) {fmt(extra)} match none of the Model's, so their values "
                "would not come from the problem's inputs"
            )
        unused = [(k, s) for k, s in new_state.items() if k not in taken and k not in params]
        if unused and missing:
            parts.append(f"ModelNew's unmatched buffer(s): {fmt(unused)}")
        raise WeightMismatch(
            "; ".join(parts) + ". The problem passes the Model's parameters and buffers as inputs "
            "and ModelNew receives them by state_dict name: keep the Model's attribute names "
            "(self.conv = nn.Conv2d(...), self.bias = nn.Parameter(...))."
        )
    return out


def drop_bound_parameters(module: Any, names: list[str]) -> None:
    """Shrink the parameters ``names`` (every one the call binds from the problem's inputs) to
    empty tensors before the module moves to the device: ``functional_call`` never reads them,
    and kept they were a second device copy of every weight beside the inputs (a third with the
    inputs' read-only copy: 24.3 GiB for an 8.05 GiB MLP on the H200). Each parameter shrinks in
    place, the same object: a TorchScript submodule, an RNN's flat weights or an alias the
    candidate keeps (``self.meta = [self.fc.weight]``) still see it, and follow ``.to``."""
    import torch

    for name in names:
        param = module.get_parameter(name)
        param.data = torch.empty(0, dtype=param.dtype)


def _check_signatures(cls: type, ref: ModuleType, init: list[Any], entry: str) -> None:
    try:
        inspect.signature(cls).bind(*init)
    except TypeError as exc:
        raise BuildError(
            f"{entry}: ModelNew{_signature(cls)} does not accept the Model's constructor arguments "
            f"({_describe_init(ref, init)}), which the guard passes as ModelNew(*get_init_inputs()): {exc}"
        ) from None
    except ValueError:
        pass  # no signature to read (a C type): the first call will say
    forward = getattr(cls, "forward", None)
    args = list(ref._KA_ARGS)
    if forward is None or not callable(forward):
        raise BuildError(f"{entry}: ModelNew defines no forward(...)")
    try:
        inspect.signature(forward).bind(None, *args)
    except TypeError:
        raise BuildError(
            f"{entry}: ModelNew.forward{_signature(forward)} must take the Model's forward "
            f"argument(s) ({', '.join(args) or 'none'}): {len(args)} positional argument(s) after self"
        ) from None
    except ValueError:
        pass


def _check_weights_on_meta(cls: type, ref: ModuleType, init: list[Any], entry: str) -> None:
    """The weight mapping at the file's own sizes, on the meta device (nothing allocated).
    A model that cannot be built on meta is checked at its first call instead."""
    import torch

    try:
        with torch.device("meta"):
            model = ref.Model(*init)
            new = cls(*init)
    except Exception:  # noqa: BLE001 - checked at the first call, on the real device
        return
    state = model.state_dict(keep_vars=True)
    ref_state = [(k, tuple(state[k].shape)) for _, k in ref._KA_STATE if k in state]
    try:
        match_weights(ref_state, new)
    except WeightMismatch as exc:
        raise BuildError(f"{entry}: {exc}") from None


def modelnew_entry(cls: type, entry: str, srcdir: Path) -> Callable[..., Any]:
    """The ``run(...)`` that judges the class ``cls`` (KernelBench's ModelNew)."""
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise BuildError(f"{entry}: a class entry point must be a torch.nn.Module subclass (KernelBench's ModelNew)")
    ref = kernelbench_reference(srcdir)
    if ref is None:
        raise BuildError(
            f"{entry}: a ModelNew class is a candidate for problems imported from KernelBench "
            "(kernelarc import FILE.py); this problem is not one: define run(...) with the "
            "problem's inputs"
        )
    init = list(ref.get_init_inputs())
    _check_signatures(cls, ref, init, entry)
    _check_weights_on_meta(cls, ref, init, entry)
    n_args = len(ref._KA_ARGS)
    state_keys = [key for _, key in ref._KA_STATE]
    n_inputs = n_args + len(state_keys)
    models: dict[tuple[object, str, str], tuple[Any, list[tuple[str, bool]], dict[str, Any]]] = {}

    def build(
        init_now: list[Any], device: Any, weights: tuple[Any, ...]
    ) -> tuple[Any, list[tuple[str, bool]], dict[str, Any]]:
        # construction draws from a stream of its own (the CPU's, restored after; built on
        # the CPU, then moved), so it neither depends on nor disturbs the worker's draws
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(0)
            new = cls(*init_now)
        ref_state = [(k, tuple(getattr(w, "shape", ()))) for k, w in zip(state_keys, weights)]
        try:
            mapping = match_weights(ref_state, new)
        except WeightMismatch as exc:
            raise WeightMismatch(
                f"ModelNew({_describe_init(ref, init_now)}), as this workload builds it: {exc}"
            ) from None
        drop_bound_parameters(new, [name for name, is_param in mapping.values() if is_param])
        new = new.to(device)
        buffers = dict(new.named_buffers(remove_duplicate=False))
        plan = [(mapping[k][0], mapping[k][1]) for k in state_keys]
        return new, plan, buffers

    @torch.no_grad()
    def run(*values: Any) -> Any:
        if len(values) != n_inputs:
            raise TypeError(f"expected {n_inputs} inputs, got {len(values)}")
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        init_now = list(ref.get_init_inputs())
        # the axes too, as the reference keys its Model: a Model may read a module constant
        # that get_init_inputs() does not pass
        key = (getattr(ref, "_ka_axes_key", None), repr(init_now), str(device))
        if key not in models:
            if len(models) >= MAX_MODELS:
                models.clear()
            models[key] = build(init_now, device, values[n_args:])
        module, plan, buffers = models[key]
        params = {}
        for (name, is_param), value in zip(plan, values[n_args:]):
            if is_param:
                params[name] = value
            else:
                buffers[name].copy_(value)
        # a tied parameter is passed once, under its first name: the call binds its other names
        return torch.func.functional_call(module, params, tuple(values[:n_args]))

    run.__name__ = "run"
    run.__qualname__ = f"ModelNew adapter for {entry}"
    return run
