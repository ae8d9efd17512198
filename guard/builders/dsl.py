"""What the Python kernel DSLs (CuTe DSL, cuTile, TileLang) share: a candidate is a Python
module like any other (imported by the Python builder, screened by the Python rules, judged by
the same correctness and timing), but it needs an optional package and a GPU the DSL supports.

Each DSL's builder (``cute_dsl.py``, ``cutile.py``, ``tilelang.py``) names its requirement.
When the package is missing, or the device cannot run the DSL, the candidate is not judged: the
guard refuses it before anything is recorded (``refusal``), and a worker that gets one anyway
fails its build with the same message, naming the package and the extra that installs it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import BuildError
from .python import PythonBuilder

log = logging.getLogger(__name__)

EXTRA = "dsl"
INSTALL_HINT = f"pip install 'kernelarc-mcp[{EXTRA}]'"


@dataclass(frozen=True)
class Requirement:
    language: str
    title: str  # how people call it: "CuTe DSL"
    package: str  # the distribution to install
    module: str  # the module a candidate imports
    # compute capability majors the DSL runs on (from its documentation); None: any CUDA GPU
    capability_majors: tuple[int, ...] | None = None
    device_note: str = ""  # where the supported devices are documented


def package_installed(package: str, module: str) -> bool:
    """Whether the distribution ``package`` is installed (its metadata), else whether ``module``
    can be found (a source checkout); nothing is imported: a DSL's import can be slow or touch
    the GPU."""
    try:
        importlib.metadata.distribution(package)
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def missing_package(req: Requirement) -> str | None:
    if package_installed(req.package, req.module):
        return None
    return (
        f"{req.title} candidates (language {req.language!r}) need the package {req.package}, which is "
        f"not installed where this guard runs; install the optional extra: {INSTALL_HINT}"
    )


def unsupported_device(req: Requirement, device_kind: str, capability: tuple[int, int] | None) -> str | None:
    """Why the device cannot run the DSL, or None. ``capability``: the GPU's (major, minor)."""
    if device_kind != "cuda":
        return (
            f"{req.title} candidates (language {req.language!r}) run on an NVIDIA GPU only; this guard "
            "evaluates on the CPU"
        )
    if capability is not None and req.capability_majors is not None and capability[0] not in req.capability_majors:
        majors = ", ".join(f"{m}.x" for m in req.capability_majors)
        return (
            f"{req.title} does not run on this GPU (compute capability {capability[0]}.{capability[1]}): "
            f"it supports compute capability {majors}{' ' + req.device_note if req.device_note else ''}"
        )
    return None


def refusal(req: Requirement, device_kind: str, capability: tuple[int, int] | None = None) -> str | None:
    """Why this guard cannot judge the DSL's candidates at all (package, then device), or None."""
    return missing_package(req) or unsupported_device(req, device_kind, capability)


def _capability(device: str) -> tuple[int, int] | None:
    if not device.startswith("cuda"):
        return None
    import torch

    major, minor = torch.cuda.get_device_capability()
    return major, minor


class DslBuilder:
    """The Python builder behind a DSL's requirement check."""

    requirement: Requirement

    @property
    def languages(self) -> tuple[str, ...]:
        return (self.requirement.language,)

    def build(self, solution: dict[str, object], srcdir: Path, builddir: Path, device: str) -> Callable[..., object]:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        why = refusal(self.requirement, kind, _capability(device) if kind == "cuda" else None)
        if why:
            status = "COMPILE_ERROR" if missing_package(self.requirement) else "RUNTIME_ERROR"
            raise BuildError(why, status=status)
        return PythonBuilder().build(solution, srcdir, builddir, device)
