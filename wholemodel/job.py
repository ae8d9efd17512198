"""One ``kernelarc verify``: what it plugs into which model, as data, and running it.

The command resolves its sources (a run, a candidate, a file, the seeds) into a
``VerifyJob``: the model's spec and each kernel's problem definition and solution. The job
runs the same way in this process (``run``) and in the guard's sandbox
(``wholemodel.sandboxed``), where it crosses as JSON: nothing of the workspace goes with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from guard.candidates.solution import Solution
from guard.problems.problem import Problem
from guard.problems.schema import Definition

from . import accuracy
from .verify import Verification


class KernelJob(BaseModel):
    """One kernel: its problem's definition (what the sites match on), its solution and
    where it came from (shown in the tables)."""

    model_config = ConfigDict(extra="forbid")
    definition: dict
    solution: dict
    origin: str

    @classmethod
    def of(cls, problem: Problem, solution: Solution, origin: str) -> KernelJob:
        return cls(definition=problem.definition.to_json(), solution=solution.model_dump(mode="json"), origin=origin)

    def problem(self) -> Problem:
        return Problem(Definition.model_validate(self.definition), workloads=[])

    def parsed_solution(self) -> Solution:
        return Solution.model_validate(self.solution)


class VerifyJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str  # a built-in model's spec, or a model file's absolute path
    device: str  # "cpu" or "cuda", resolved by the caller
    dtype: str | None = None
    kernels: list[KernelJob] = Field(min_length=1)
    reps: int = Field(ge=1)
    diagnose: bool = False
    factor: float = Field(default=accuracy.DEFAULT_FACTOR, gt=0)

    def model_file(self) -> Path | None:
        """The model's file, where the model is one rather than a built-in."""
        path = Path(self.model)
        return path if path.is_absolute() else None


def run(job: VerifyJob, build_root: Path, say: Callable[[str], None]) -> Verification:
    """Load the model, build every kernel into ``build_root`` and verify them, in this process."""
    from .loader import load
    from .verify import build_kernel, use_triton_interpreter, verify

    lm = load(job.model, device=job.device, dtype=job.dtype)
    if lm.device == "cpu":
        use_triton_interpreter()
    build_root.mkdir(parents=True, exist_ok=True)
    kernels = []
    for k in job.kernels:
        problem = k.problem()
        say(f"building {problem.name} ({k.origin})")
        kernels.append(build_kernel(problem, k.parsed_solution(), k.origin, lm.device, build_root))
    return verify(lm, kernels, reps=job.reps, diagnose=job.diagnose, factor=job.factor, on_progress=say)
