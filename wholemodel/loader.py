"""What ``kernelarc profile MODEL`` and ``kernelarc verify MODEL`` accept.

MODEL is a built-in model (``llama_block`` or ``gpt2_block``, optionally ``:small``) or a
Python file that defines:

```python
def build_model(device: str, dtype: torch.dtype) -> torch.nn.Module: ...   # ready, in eval mode
def example_inputs(device: str, dtype: torch.dtype) -> tuple: ...          # positional forward args
```

The guard never runs this file. ``kernelarc profile`` runs it in the calling process;
``kernelarc verify`` in the guard's sandbox with the kernels (``wholemodel.sandboxed``), which
gets the file's text and no folder of the user's, or in the calling process with ``--in-process``.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from . import builtin


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    inputs: tuple
    device: str
    dtype: torch.dtype


def pick_device(choice: str = "auto") -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here")
    return choice


def pick_dtype(name: str | None, device: str) -> torch.dtype:
    if name is None:  # bf16 on the GPU; float32 on the CPU, where bf16 is slow and inexact
        return torch.bfloat16 if device == "cuda" else torch.float32
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"unknown dtype {name!r}: not a floating-point dtype of torch")
    return dt


def model_spec(spec: str) -> str:
    """``spec`` as it names the same model from any folder: a built-in's as given, a file's
    absolute path (``kernelarc verify`` loads it again in a sandbox, from another folder)."""
    if _builtin(spec, "cpu") is not None:
        return spec
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{spec}: not a built-in model ({', '.join(builtin.SIZES)}) nor a Python file")
    return str(path.resolve())


def _builtin(spec: str, device: str, size: str | None = None) -> tuple[str, str] | None:
    """(name, size) of a built-in model's spec on ``device``; None for a file."""
    name, _, variant = spec.removeprefix("builtin:").partition(":")
    if name not in builtin.SIZES:
        return None
    size = size or variant or ("real" if device == "cuda" else "small")
    if size not in builtin.SIZES[name]:
        raise ValueError(f"{name}: no size {size!r} (sizes: {', '.join(builtin.SIZES[name])})")
    return name, size


def model_name(spec: str, device: str) -> str:
    """What ``load(spec)`` names the model on ``device`` (``cpu`` or ``cuda``): the tables' name."""
    known = _builtin(spec, device)
    if known is not None:
        return f"{known[0]}_{known[1]}"
    return "".join(c if c.isalnum() or c == "_" else "_" for c in Path(spec).stem)[:40]


def load(spec: str, device: str = "auto", dtype: str | None = None, size: str | None = None) -> LoadedModel:
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    known = _builtin(spec, dev, size)
    if known is not None:
        model, inputs = builtin.build(known[0], known[1], dev, dt)
        return LoadedModel(f"{known[0]}_{known[1]}", model, inputs, dev, dt)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{spec}: not a built-in model ({', '.join(builtin.SIZES)}) nor a Python file")
    mod_name = f"kernelarc_user_model_{abs(hash(path.resolve())) % 10**8}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    module_spec.loader.exec_module(module)
    for fn in ("build_model", "example_inputs"):
        if not callable(getattr(module, fn, None)):
            raise ValueError(f"{path}: defines no {fn}(device, dtype) (see `kernelarc profile --help`)")
    with torch.no_grad():
        model = module.build_model(dev, dt).eval()
        inputs = tuple(module.example_inputs(dev, dt))
    return LoadedModel(model_name(spec, dev), model, inputs, dev, dt)
