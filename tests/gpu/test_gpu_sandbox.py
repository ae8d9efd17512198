"""The OS sandbox on a GPU (run on the H200: ``pytest -m gpu tests/gpu/test_gpu_sandbox.py``):
candidate workers of each language build and run inside bubblewrap with the GPU's device
nodes bound, and a CUDA C++ build made in one worker's folder is published to the shared
cache and loaded from there, read-only, by the next worker."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from guard import sandbox  # noqa: E402
from guard.builders.cuda_cpp import extension_digest, hand_build, publish_build  # noqa: E402
from guard.candidates.load import from_source  # noqa: E402
from guard.problems.derive import workload_set  # noqa: E402
from guard.problems.store import ProblemStore  # noqa: E402
from guard.runner import messages as m  # noqa: E402
from guard.runner.process import WorkerProcess  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

from helpers import RMS, honest_source, unique  # noqa: E402

SOURCES = {
    "pytorch": ("kernel.py", lambda: honest_source()),
    "triton": ("kernel.py", lambda: unique((SEEDS_DIR / RMS / "seed_triton.py").read_text())),
    "cuda_cpp": ("kernel.cu", lambda: (SEEDS_DIR / RMS / "seed_cuda.cu").read_text()),
}


def _problem():
    problem = ProblemStore(Path("/nonexistent-kernelarc-problems")).get(RMS)
    return problem, workload_set(problem, "cuda", b"\1" * 32).visible[0]


def _start(tmp_path: Path, name: str) -> WorkerProcess:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "secret.key").write_text("ab" * 32)
    worker = WorkerProcess("candidate", "cuda", tmp_path / name, protect=[ws]).start()
    info = worker.wait_ready(180)
    assert worker.isolation == "bubblewrap" and info.get("gpu"), info
    return worker


def _prepare_and_check(worker: WorkerProcess, solution: dict, language: str, cache: Path) -> dict:
    problem, w = _problem()
    d = problem.definition
    blob_root = str(problem.root) if problem.root else None
    ready = worker.request(m.Setup(definition=d.to_json(), blob_root=blob_root).model_dump(mode="json"), 60)
    assert ready.get("ok"), ready
    # as the build gate does: the worker gets its own source's finished build, never the cache
    digest = extension_digest(solution) if language == "cuda_cpp" else None
    handed = hand_build(cache, digest, worker.workdir) if digest else None
    prepare = m.Prepare(solution=solution, language=language, build_cache=str(handed) if handed else None)
    built = worker.request(prepare.model_dump(mode="json"), 600)
    assert built.get("ok"), built
    checked = worker.request(
        {
            "op": "check",
            "workload": w.model_dump(mode="json"),
            "axes": d.resolve_axes(w.axes),
            "rounds": [{"seed": 3, "kind": "normal", "tag": "r0"}],
            "repeat": {"within": None},  # the first round twice: the determinism check
            "outdir": str(worker.outdir),
        },
        300,
    )
    assert checked.get("ok"), checked
    files = [Path(o["file"]) for r in checked["rounds"] for o in r["outputs"]]
    assert files and all(f.parent == worker.outdir and f.stat().st_size for f in files)
    return built


def test_probe_finds_the_sandbox():
    iso = sandbox.probe()
    assert iso.available, iso.line()


@pytest.mark.parametrize("language", ["pytorch", "triton", "cuda_cpp"])
def test_candidate_builds_and_runs_in_the_sandbox(tmp_path, language):
    filename, source = SOURCES[language]
    solution = from_source(source(), language, filename).model_dump(mode="json", exclude_none=True)
    worker = _start(tmp_path, "first")
    try:
        first = _prepare_and_check(worker, solution, language, tmp_path / "cache")
        if language != "cuda_cpp":
            return
        digest = extension_digest(solution)
        assert publish_build(worker.workdir, digest, tmp_path / "cache")
    finally:
        worker.kill()
    # the next worker loads the published build, handed to its own folder: no compile
    again = _start(tmp_path, "second")
    try:
        second = _prepare_and_check(again, solution, language, tmp_path / "cache")
        assert not (again.workdir / "build" / digest).exists()
        assert second["build_s"] < max(5.0, first["build_s"] / 4), (first["build_s"], second["build_s"])
    finally:
        again.kill()
