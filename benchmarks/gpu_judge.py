"""What the GPU scripts that judge kernels through the guard share (``dsl_seeds.py``,
``sol_regression.py``): which kernel DSLs can run where the script runs, the guard's settings
for a short device call, one evaluation's summary, and merging the results of several calls
(the DSL packages travel one per device call).

Installs nothing: a DSL's package must already be importable (on the GPU machine, wheels
unpacked onto PYTHONPATH by the caller).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# language -> (module a candidate imports, distributions whose versions a result reports)
DSL_PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cute_dsl": ("cutlass.cute", ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base")),
    "cutile": ("cuda.tile", ("cuda-tile", "nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm")),
    "tilelang": ("tilelang", ("tilelang", "apache-tvm-ffi", "z3-solver")),
}
IMPORT_TIMEOUT_S = 180
# statuses of an entry that a run did not get to judge: a later run's result replaces it, never
# the other way round (``merge_runs``)
NOT_RUN = ("NOT_INSTALLED", "IMPORT_FAILED", "SKIPPED", "NO_SEED")
SETTINGS = "guard defaults except 0.1 s of timing per workload, at most 300 iterations, no torch.compile baseline"


def cutlass_path_fix() -> str | None:
    """nvidia-cutlass-dsl puts its ``cutlass`` package on sys.path through a .pth file, which
    Python reads only in site-packages folders, not in a PYTHONPATH folder (wheels unpacked with
    ``pip install --target``). Read it as site-packages would, and add what it adds to PYTHONPATH
    too, for the guard's workers, which inherit it. Returns what was added, or None."""
    try:
        if importlib.util.find_spec("cutlass") is not None:
            return None
    except (ImportError, ValueError):
        return None
    before = list(sys.path)
    for folder in before:
        if folder and Path(folder).is_dir() and any(Path(folder).glob("nvidia_cutlass_dsl*.pth")):
            site.addsitedir(folder)
    added = [p for p in sys.path if p not in before]
    if not added:
        return None
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), *added) if p)
    return os.pathsep.join(added)


def versions(dists: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = None
    return out


def check_import(module: str) -> tuple[bool, float, str]:
    """Import ``module`` in a child process (a DSL's import can be slow, touch the GPU or crash):
    whether it worked, how long it took, and the end of its error."""
    t = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            env=dict(os.environ),
        )
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t, f"import {module} took more than {IMPORT_TIMEOUT_S} s"
    ok = proc.returncode == 0
    tail = "" if ok else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
    return ok, time.monotonic() - t, tail


def toolchain() -> dict[str, str | None]:
    """Where the compilers the DSLs call were found (nvcc for TileLang; tileiras for cuTile, which
    takes the pip one from the first folder of ``nvidia.cu13``, else the one on PATH)."""
    out: dict[str, str | None] = {name: shutil.which(name) for name in ("nvcc", "ptxas", "tileiras")}
    out["CUDA_HOME"] = os.environ.get("CUDA_HOME")
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
    except (ImportError, ValueError):
        spec = None
    out["nvidia.cu13"] = os.pathsep.join(spec.submodule_search_locations or []) if spec else None
    return out


def dsl_readiness(language: str) -> dict[str, Any]:
    """Whether the guard here can judge ``language`` on the GPU: ``{"ready": True, ...}``, or an
    entry with the status (NOT_INSTALLED, IMPORT_FAILED) and the reason it cannot. A language
    that is no DSL (pytorch, triton, cuda_cpp) is always ready. Call it before the guard starts
    its workers, which inherit PYTHONPATH (``cutlass_path_fix``)."""
    if language not in DSL_PACKAGES:
        return {"ready": True}
    from guard.builders import dsl_refusal

    module, dists = DSL_PACKAGES[language]
    entry: dict[str, Any] = {"ready": False, "versions": versions(dists)}
    if refusal := dsl_refusal(language, "cuda"):
        entry.update(status="NOT_INSTALLED", reason=refusal)
        return entry
    ok, secs, err = check_import(module)
    entry["import_s"] = secs
    if ok:
        entry["ready"] = True
    else:
        entry.update(status="IMPORT_FAILED", reason=f"import {module}: {err}")
    return entry


def open_guard(prefix: str) -> Any:
    """A guard on the GPU over a fresh workspace in a temporary folder, with the settings of a
    short device call (``SETTINGS``); use it as a context manager."""
    from guard.cascade import Guard
    from guard.config import GuardConfig
    from guard.workspace import Workspace

    ws = Workspace.open(Path(tempfile.mkdtemp(prefix=prefix)) / "ws")
    cfg = GuardConfig(target_time_s=0.1, max_iters=300, compile_baseline=False, build_timeout_s=240)
    return Guard(ws, cfg, device="cuda")


def summarize(v: Any, wall_s: float) -> dict[str, Any]:
    ws = v.workloads
    return {
        "status": v.status,
        "decision": v.decision,
        "reason": v.reason if v.status != "PASSED" else None,
        "median_ms": statistics.median(w.latency_ms for w in ws) if ws else None,
        "eager_median_ms": statistics.median(w.eager_ms for w in ws if w.eager_ms) if ws else None,
        "speedup_eager": v.speedup_eager,
        "wall_s": wall_s,
        "per_workload": [{"uuid": w.uuid, "axes": w.axes, "ms": w.latency_ms, "eager_ms": w.eager_ms} for w in ws],
    }


def judge(guard: Any, load: Callable[[], Any], problem: str, agent: str) -> dict[str, Any]:
    """One evaluation of the solution ``load()`` returns, as a result entry; a solution that does
    not load (LOAD_ERROR), a refusal (REFUSED) or a failure of the guard itself (ERROR) is an
    entry too, so that one solution's failure never ends the run."""
    from guard.candidates.load import CandidateError
    from guard.cascade import GuardError

    t = time.monotonic()
    try:
        solution = load()
    except CandidateError as exc:
        return {"status": "LOAD_ERROR", "reason": str(exc)[:2000], "wall_s": time.monotonic() - t}
    try:
        v = guard.evaluate(solution, problem, agent=agent)
        return summarize(v, time.monotonic() - t)
    except GuardError as exc:  # refused before anything ran
        return {"status": "REFUSED", "reason": str(exc)[:2000], "wall_s": time.monotonic() - t}
    except Exception as exc:
        return {"status": "ERROR", "reason": f"{type(exc).__name__}: {exc}"[:2000], "wall_s": time.monotonic() - t}


def merge_runs(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Runs of one DSL each as one result: an entry of ``result[key]`` measured in a later run
    replaces an earlier one's, unless the later run did not get to judge it (``NOT_RUN``)."""
    out = dict(results[0], **{key: {}})
    for r in results:
        for name, e in r[key].items():
            if name not in out[key] or e.get("status") not in NOT_RUN:
                out[key][name] = e
        out["device"] = r.get("device") or out.get("device", {})
    return out
