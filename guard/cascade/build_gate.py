"""Gate 2: building a candidate in its worker (the evaluated one, or an incumbent timed again
beside it), through the language's builder (guard/builders/). A CUDA C++ build that worked is
published to the shared extension cache under the digest the guard computed from the source
itself, so a worker cannot plant a library under another source's digest."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..builders.cuda_cpp import extension_digest, hand_build, publish_build
from ..config import GuardConfig
from ..paths import cache_dir
from ..problems.problem import Problem
from ..runner import messages as m
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .reasons import GuardError, candidate_status, first_line

log = logging.getLogger(__name__)


def extension_cache() -> Path:
    return cache_dir() / "torch_extensions"


def build(
    worker: WorkerProcess, problem: Problem, solution: dict[str, Any], language: str, cfg: GuardConfig
) -> m.Reply:
    """Set the worker up for the problem, then build the candidate in it: the reply to
    ``prepare`` (``ok`` False with a status and message when the build failed); a successful
    CUDA C++ build is published to the cache. Raises GuardError when the worker's own set-up
    fails, before any of the candidate's code ran; from the build on, whatever the worker
    answers may be the candidate's doing, so an INTERNAL reply is the candidate's failure
    (``reasons.candidate_status``: a red team's import could otherwise withhold its verdict)."""
    setup = m.Setup(
        definition=problem.definition.for_candidates(),
        blob_root=str(problem.root) if problem.root else None,
        settle_dynamo=names_dynamo(json.dumps(solution), problem.definition.reference),
    )
    try:  # no candidate code has run in the worker yet: any failure here is the guard's
        ready = m.parse_reply(worker.request(setup.model_dump(mode="json"), cfg.call_timeout_s), m.SetupReply)
    except m.MessageError as exc:
        raise GuardError(f"the candidate worker answered its set-up out of protocol: {exc}") from None
    except (WorkerDied, WorkerTimeout) as exc:
        raise GuardError(f"the candidate worker failed while setting up the problem: {exc}") from None
    if not ready.ok:
        raise GuardError(f"the candidate worker could not set up the problem: {first_line(ready.message or '')}")
    worker.ns_pid = ready.pid
    digest = extension_digest(solution) if language == "cuda_cpp" else None
    # the worker sees its own source's finished build only, never the shared cache
    handed = hand_build(extension_cache(), digest, worker.workdir) if digest is not None else None
    request = m.Prepare(solution=solution, language=language, build_cache=str(handed) if handed else None)
    raw = worker.request(request.model_dump(mode="json"), cfg.build_timeout_s)
    try:
        reply = m.parse_reply(raw, m.PrepareReply)
    except m.MessageError as exc:  # as any other request's reply (``asking``): the candidate's doing
        return m.Reply(ok=False, status="REWARD_HACK", message=f"the worker answered out of protocol: {exc}")
    if not reply.ok:
        if reply.status == "INTERNAL":
            log.warning("the candidate's worker failed while building it: %s", first_line(reply.message or ""))
        status = candidate_status(reply.status) if reply.status else "COMPILE_ERROR"
        return reply.model_copy(update={"status": status})
    if digest is not None and handed is None:
        publish_build(worker.workdir, digest, extension_cache())
    return reply


def names_dynamo(*texts: str) -> bool:
    """Whether code may import ``torch._dynamo`` (``torch.compile`` and the like), so that the
    worker imports it before the candidate's code (``harness.settle_dynamo``); a source that
    hides it gains nothing: its import then reads as a patch."""
    return any(word in text for text in texts for word in ("compile", "dynamo", "inductor"))
