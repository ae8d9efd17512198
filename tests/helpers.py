"""The tests' shared helpers, in one place: paths, the fast guard settings, guards and
services made with them, the ``kernelarc`` command in a subprocess, a served workspace,
the cheat files. What the benchmarks use too is defined in ``benchmarks/harness.py`` (the
benchmarks may not import the tests) and offered here under the same names."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import (
    CHEATS,
    FAST,
    REPO,
    RMS,
    HttpServer,
    cheat_source,
    expectation,
    fast_config,
    fast_workspace,
    free_port,
    honest_source,
    kernelarc,
    submit_cheat,
    token,
    unique,
)

__all__ = [
    "CHEATS",
    "DATA",
    "FAST",
    "REPO",
    "RMS",
    "SOL_EXAMPLES",
    "HttpServer",
    "cheat_files",
    "cheat_source",
    "expectation",
    "fast_config",
    "fast_workspace",
    "free_port",
    "honest_source",
    "kernelarc",
    "make_guard",
    "make_service",
    "submit_cheat",
    "token",
    "unique",
]

DATA = REPO / "tests" / "data"
SOL_EXAMPLES = DATA / "sol-execbench-examples"


def cheat_files(device: str) -> list[Path]:
    """The cheats a guard on ``device`` can judge: every one but the honest control, the
    GPU-only ones (``DEVICE=cuda``) on a GPU only, CUDA C++ (``.cu``) on a GPU only."""
    out = []
    for p in sorted([*CHEATS.glob("*.py"), *CHEATS.glob("*.cu")]):
        if p.name == "honest_torch.py":
            continue
        if device != "cuda" and (p.suffix == ".cu" or expectation(p).get("DEVICE") == "cuda"):
            continue
        out.append(p)
    return out


def make_guard(path: Path, **overrides):
    """A guard on the CPU over the workspace at ``path``, with the fast settings."""
    from guard.cascade import Guard
    from guard.workspace import Workspace

    return Guard(Workspace.open(path), fast_config(**overrides), device="cpu")


def make_service(path: Path, **overrides):
    """The MCP server's service on the CPU, with the fast settings and one correctness round."""
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service

    return Service(Workspace.open(path), fast_config(**{"correctness_rounds": 1, **overrides}), device="cpu")
