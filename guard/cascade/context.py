"""What the gates of one evaluation share: the candidate, its workloads and seed, the
trusted worker holding the problem, and where progress goes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..problems.derive import WorkloadSet
from ..problems.problem import Problem
from ..problems.schema import Definition, Workload
from ..runner.process import WorkerProcess

if TYPE_CHECKING:
    from ..config import GuardConfig
    from .reference_side import ReferenceSide

# progress(phase, done, total, detail)
Progress = Callable[[str, int, int, str], None]


def noop(phase: str, done: int, total: int, detail: str) -> None:
    pass


@dataclass
class EvalContext:
    """One candidate's evaluation, from the moment its worker is taken."""

    cid: str
    problem: Problem
    wset: WorkloadSet
    eval_seed: int
    cand: WorkerProcess  # the candidate's own worker, used once
    trusted: WorkerProcess  # the reference side's worker, with the problem loaded
    key: str  # the problem's key in the trusted worker
    progress: Progress
    ref: "ReferenceSide"  # seeds, timing slot, trusted requests, the guard's configuration and device
    dps: bool = False  # destination passing: the outputs are buffers the guard passes in

    @property
    def outdir(self) -> Path:
        """Where the candidate writes the outputs the trusted worker compares: inside its
        worker's own folder (a sandboxed worker can write nowhere else), gone with it."""
        return self.cand.outdir

    @property
    def definition(self) -> Definition:
        return self.problem.definition

    @property
    def visible(self) -> list[Workload]:
        return self.wset.visible

    @property
    def cfg(self) -> "GuardConfig":
        return self.ref.cfg
