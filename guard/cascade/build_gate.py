"""Gate 2: building a candidate in its worker (the evaluated one, or an incumbent timed again
beside it), through the language's builder (guard/builders/). A CUDA C++ build that worked is
published to the shared extension cache under the digest the guard computed from the source
itself, so a worker cannot plant a library under another source's digest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..builders.cuda_cpp import extension_digest, publish_build
from ..config import GuardConfig
from ..paths import cache_dir
from ..problems.problem import Problem
from ..runner import messages as m
from ..runner.process import WorkerProcess


def extension_cache() -> Path:
    return cache_dir() / "torch_extensions"


def build(
    worker: WorkerProcess, problem: Problem, solution: dict[str, Any], language: str, cfg: GuardConfig
) -> m.Reply:
    """The worker's reply to ``prepare`` (``ok`` False with a status and message when the build
    failed); a successful CUDA C++ build is published to the cache."""
    request = m.Prepare(
        definition=problem.definition.to_json(),
        solution=solution,
        language=language,
        blob_root=str(problem.root) if problem.root else None,
        build_cache=str(extension_cache()),
    )
    raw = worker.request(request.model_dump(mode="json"), cfg.build_timeout_s)
    try:
        reply = m.parse_reply(raw, m.PrepareReply)
    except m.MessageError as exc:
        return m.Reply(ok=False, status="RUNTIME_ERROR", message=f"the worker answered out of protocol: {exc}")
    if reply.ok and language == "cuda_cpp":
        digest = extension_digest(solution)
        if digest is not None:
            publish_build(worker.workdir, digest, extension_cache())
    return reply
