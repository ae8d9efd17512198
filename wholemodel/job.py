"""One ``kernelarc verify``: what it plugs into which model, as data, and running it.

The command resolves its sources (a run, a candidate, a file, the seeds) into a
``VerifyJob``: the model's spec and each kernel's problem definition and solution. The job
runs the same way in this process (``run``) and in the guard's sandbox
(``wholemodel.sandboxed``), where it crosses as JSON: nothing of the workspace goes with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from guard.candidates.solution import Solution
from guard.problems.problem import Problem
from guard.problems.schema import Definition

from . import accuracy
from .verify import KernelUse, Trial, Verification


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
    # the model file's text, where it travels with the job (into a sandbox, which shows no
    # folder of the user's): written to the job's own folder there and loaded from it
    model_source: str | None = None
    device: str  # "cpu" or "cuda", resolved by the caller
    dtype: str | None = None
    kernels: list[KernelJob] = Field(min_length=1)
    reps: int = Field(ge=1)
    diagnose: bool = False
    factor: float = Field(default=accuracy.DEFAULT_FACTOR, gt=0, allow_inf_nan=False)

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


# -- what a sandboxed job sends back -------------------------------------------------------------
# Read from a process that ran agents' kernels: every field typed and bounded, and what is shown
# as text the job's own or made here from the figures: the model's name and dtype, the kernels
# and their origins, the check's message (a result's names once cleared the user's terminal
# and set its clipboard, and named another model as PASSED; red team, session 43).
Figure = Annotated[float, Field(allow_inf_nan=True)]  # an error may be inf; a NaN one fails
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorsResult(_Strict):
    rel_l2: Figure
    max_abs: Figure
    nonfinite: int = Field(ge=0)


class CheckResult(_Strict):
    ok: bool
    plugged: ErrorsResult
    own: ErrorsResult
    limit_rel_l2: Figure
    limit_max_abs: Figure
    message: str = Field(max_length=1000)  # not shown: made again from the figures
    mismatch: bool = False

    def to_check(self) -> accuracy.Check:
        """The check as its figures say, its message made here; a check whose outcome its own
        figures contradict is none."""
        check = accuracy.judged(
            accuracy.Errors(**self.plugged.model_dump()),
            accuracy.Errors(**self.own.model_dump()),
            self.limit_rel_l2,
            self.limit_max_abs,
            self.mismatch,
        )
        if self.ok and not check.ok:
            raise ValueError("its check passes against its own figures")
        return check


class UseResult(_Strict):
    served: int = Field(ge=0)
    declined: int = Field(ge=0)
    own_s: list[Finite] = Field(max_length=100_000)
    kernel_s: list[Finite] = Field(max_length=100_000)


class TrialResult(_Strict):
    kernels: list[str] = Field(max_length=1000)
    check: CheckResult
    model_ms: Finite
    plugged_ms: Finite
    speedup: Figure  # not shown: made again from the two times
    use: dict[str, UseResult]

    def to_trial(self) -> Trial:
        use = {n: KernelUse(**u.model_dump()) for n, u in self.use.items()}
        return Trial(list(self.kernels), self.check.to_check(), self.model_ms, self.plugged_ms, use)


class VerificationResult(_Strict):
    model: str = Field(max_length=100)
    device: Literal["cpu", "cuda"]
    dtype: str = Field(max_length=20)
    error_factor: Finite
    reps: int = Field(ge=1)
    ok: bool
    origins: dict[str, str]  # not shown: the job's own are
    total: TrialResult
    alone: list[TrialResult] = Field(max_length=1000)

    def for_job(self, job: VerifyJob) -> Verification:
        """The verification, where it is one of ``job``: its model, dtype, device and settings,
        all its kernels together, and each alone where it asked for that."""
        from .loader import model_name, pick_dtype

        names = [k.problem().name for k in job.kernels]
        model_file = job.model_file()
        expected = (
            model_name(str(model_file) if model_file else job.model, job.device),
            str(pick_dtype(job.dtype, job.device)).removeprefix("torch."),
        )
        if (self.model, self.dtype) != expected:
            raise ValueError(f"it is of another model or dtype than {expected[0]}, {expected[1]}")
        if self.device != job.device or self.reps != job.reps or self.error_factor != job.factor:
            raise ValueError("its device or settings are not the job's")
        trials = [self.total.kernels, *(t.kernels for t in self.alone)]
        if trials != [names, *([[n] for n in names] if job.diagnose else [])]:
            raise ValueError("its trials are not the job's")
        if any(set(t.use) != set(t.kernels) for t in (self.total, *self.alone)):
            raise ValueError("a trial reports the use of kernels it did not plug in")
        return Verification(
            self.model,
            self.device,
            self.dtype,
            self.error_factor,
            self.reps,
            self.total.to_trial(),
            [t.to_trial() for t in self.alone],
            {name: k.origin for name, k in zip(names, job.kernels)},
        )
