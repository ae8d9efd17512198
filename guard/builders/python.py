"""PyTorch and Triton candidates: the entry file is imported as a module."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from .base import BuildError, write_sources
from .trim import trim_traceback


class PythonBuilder:
    languages = ("pytorch", "triton")

    def build(self, solution: dict, srcdir: Path, builddir: Path, device: str) -> Callable:
        write_sources(solution, srcdir)
        entry_file, symbol = solution["spec"]["entry_point"].split("::")
        path = srcdir / entry_file
        if str(srcdir) not in sys.path:
            sys.path.insert(0, str(srcdir))  # for solutions of several modules
        name = f"kernelarc_candidate_{abs(hash(str(path))) % 10**8}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and triton look modules up by name
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise BuildError(f"{entry_file}:{exc.lineno}: syntax error: {exc.msg}") from None
        except BaseException as exc:  # import-time code failed (ImportError, NameError, ...)
            raise BuildError("importing the candidate failed:\n" + trim_traceback(exc, [srcdir])) from None
        fn = getattr(module, symbol, None)
        if not callable(fn):
            raise BuildError(f"{entry_file} defines no function {symbol!r}")
        return fn
