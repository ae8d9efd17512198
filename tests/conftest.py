"""Shared fixtures. Everything runs on the CPU: PyTorch CPU, Triton's interpreter, the
CPU-sized workloads of each problem. Caches and locks go to a per-session temp folder."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="kernelarc-tests-"))
os.environ["KERNELARC_CACHE_DIR"] = str(_SESSION_TMP / "cache")
os.environ["KERNELARC_LOCK_DIR"] = str(_SESSION_TMP / "locks")
os.environ.pop("KERNELARC_WORKSPACE", None)
if not Path("/dev/nvidiactl").exists():
    # Triton kernels run in this process too (kernelarc verify); its interpreter must be
    # chosen before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SOL_EXAMPLES = DATA / "sol-execbench-examples"
CHEATS = REPO / "tests" / "cheats"
RMS = "rmsnorm_llama3_8b"


def fast_config(**overrides):
    """The documented pipeline with fewer iterations, so the suite stays quick on 2 cores."""
    from guard.config import GuardConfig

    base = dict(
        compile_baseline=False, min_iters=3, max_iters=10, target_time_s=0.01,
        warmup_time_s=0.0, call_timeout_s=20, correctness_rounds=2, audits=1,
    )
    base.update(overrides)
    return GuardConfig(**base)


def expectation(path) -> dict:
    """The fields of a cheat's EXPECT line (screen=, runtime=, PROBLEM=; heldout: HELDOUT)."""
    text = path.read_text()
    m = re.search(r"EXPECT ([^\"\n]*)", text)
    assert m, f"{path.name} has no EXPECT line"
    words = m.group(1).replace("//", " ").split()
    fields = dict(kv.split("=") for kv in words if "=" in kv)
    fields["heldout"] = "HELDOUT" in words
    fields["dps"] = "DPS" in words
    return fields


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


def submit_cheat(guard, path: Path, agent: str):
    """Evaluate a cheat as its EXPECT line says: on its problem, as a destination-passing
    solution when it says DPS, as CUDA C++ when it is a .cu file."""
    import json

    from guard.candidates.load import from_solution_json, from_source

    exp = expectation(path)
    problem = exp.get("PROBLEM", RMS)
    if path.suffix == ".cu":
        solution = from_source(unique(path.read_text(), "//"), "cuda_cpp", path.name)
    elif exp["dps"]:
        solution = from_solution_json(json.dumps({
            "name": path.stem, "spec": {"languages": ["pytorch"], "entry_point": "k.py::run",
                                        "destination_passing_style": True},
            "sources": [{"path": "k.py", "content": cheat_source(path, guard)}],
        }))
    else:
        solution = from_source(cheat_source(path, guard), None, "kernel.py")
    return guard.evaluate(solution, problem, agent=agent)


def cheat_source(path, guard) -> str:
    """A cheat's source, made unique, with the visible shapes filled in where it asks."""
    source = path.read_text()
    if "{VISIBLE}" in source:  # the cheat knows the visible shapes, as an agent would
        from guard.problems.derive import workload_set

        wset = workload_set(guard.store.get(RMS), guard.device.kind, guard._secret)
        rows = sorted({w.axes["num_tokens"] for w in wset.visible})
        source = source.replace("{VISIBLE}", repr(set(rows)))
    return unique(source)


def make_guard(path: Path, **overrides):
    from guard.cascade import Guard
    from guard.workspace import Workspace

    ws = Workspace.open(path)
    return Guard(ws, fast_config(**overrides), device="cpu")


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    return _SESSION_TMP


@pytest.fixture(scope="session")
def guard(session_tmp):
    """A guard with every gate on (static screen included)."""
    g = make_guard(session_tmp / "ws-screen", call_timeout_s=10)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()


@pytest.fixture(scope="session")
def guard_runtime_only(session_tmp):
    """The static screen off: shows that the run-time defences hold on their own."""
    g = make_guard(session_tmp / "ws-runtime", static_screen=False, call_timeout_s=10)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()


_counter = [0]


def unique(source: str, comment: str = "#") -> str:
    """The same code with a new comment, so the guard measures it again."""
    _counter[0] += 1
    return source + f"\n{comment} variant {_counter[0]} {os.getpid()}\n"


def honest_source() -> str:
    return unique((CHEATS / "honest_torch.py").read_text())
