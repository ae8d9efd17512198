"""PyTorch and Triton candidates: the entry file is imported as a module."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import BuildError, write_sources
from .modelnew import kernelbench_reference, modelnew_entry
from .trim import trim_traceback


class PythonBuilder:
    languages = ("pytorch", "triton")

    def build(self, solution: dict[str, Any], srcdir: Path, builddir: Path, device: str) -> Callable[..., Any]:
        write_sources(solution, srcdir)
        entry_file, symbol = solution["spec"]["entry_point"].split("::")
        path = srcdir / entry_file
        if str(srcdir) not in sys.path:
            sys.path.insert(0, str(srcdir))  # for solutions of several modules
        name = f"kernelarc_candidate_{abs(hash(str(path))) % 10**8}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise BuildError(f"{entry_file} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and triton look modules up by name
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise BuildError(f"{entry_file}:{exc.lineno}: syntax error: {exc.msg}") from None
        except BaseException as exc:  # import-time code failed (ImportError, NameError, ...)
            raise BuildError("importing the candidate failed:\n" + trim_traceback(exc, [srcdir])) from None
        fn: object = getattr(module, symbol, None)
        if isinstance(fn, type):  # a class: KernelBench's ModelNew, wrapped in a run(...)
            return modelnew_entry(fn, f"{entry_file}::{symbol}", srcdir)
        if not callable(fn):
            raise BuildError(self._missing(module, entry_file, symbol, srcdir))
        return fn

    @staticmethod
    def _missing(module: ModuleType, entry_file: str, symbol: str, srcdir: Path) -> str:
        if symbol == "run" and isinstance(getattr(module, "ModelNew", None), type):
            return (
                f"{entry_file} defines no function 'run' but a class ModelNew: give the entry "
                f"point as '{entry_file}::ModelNew' (a file submitted alone is taken so)"
            )
        if kernelbench_reference(srcdir) is not None:
            return (
                f"{entry_file} defines neither class ModelNew nor a function {symbol!r}: a "
                "candidate for a KernelBench problem is a class ModelNew(nn.Module) taking the "
                "Model's constructor arguments, or run(...) taking the problem's inputs "
                "(the forward arguments, then the Model's parameters and buffers)"
            )
        return f"{entry_file} defines no function {symbol!r}"
