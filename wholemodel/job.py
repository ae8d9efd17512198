"""One ``kernelarc verify``: what it plugs into which model, as data, and running it.

The command resolves its sources (a run, a candidate, a file, the seeds) into a
``VerifyJob``: the model's spec and each kernel's problem definition and solution. The job
runs the same way in this process (``run``) and in the guard's sandbox
(``wholemodel.sandboxed``), where it crosses as JSON: nothing of the workspace goes with it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


# -- what a sandboxed job sends back -------------------------------------------------------------
# Read from a process that ran agents' kernels: every field typed, every string bounded and free
# of control characters (a result's kernel names once cleared the user's terminal and set its
# clipboard; red team, session 43), and the kernels and their origins those of the job.
_NAME = r"^[A-Za-z0-9_.\-]{1,100}$"


def _printable(text: str) -> str:
    if any(not ch.isprintable() for ch in text):
        raise ValueError("holds control characters")
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorsResult(_Strict):
    rel_l2: float
    max_abs: float
    nonfinite: int = Field(ge=0)


class CheckResult(_Strict):
    ok: bool
    plugged: ErrorsResult
    own: ErrorsResult
    limit_rel_l2: float
    limit_max_abs: float
    message: str = Field(max_length=1000)

    @field_validator("message")
    @classmethod
    def _message(cls, value: str) -> str:
        return _printable(value)


class UseResult(_Strict):
    served: int = Field(ge=0)
    declined: int = Field(ge=0)
    own_s: list[float] = Field(max_length=100_000)
    kernel_s: list[float] = Field(max_length=100_000)


class TrialResult(_Strict):
    kernels: list[str] = Field(max_length=1000)
    check: CheckResult
    model_ms: float
    plugged_ms: float
    speedup: float
    use: dict[str, UseResult]

    def to_trial(self) -> Trial:
        c = self.check
        check = accuracy.Check(
            c.ok,
            accuracy.Errors(**c.plugged.model_dump()),
            accuracy.Errors(**c.own.model_dump()),
            c.limit_rel_l2,
            c.limit_max_abs,
            c.message,
        )
        use = {n: KernelUse(**u.model_dump()) for n, u in self.use.items()}
        return Trial(list(self.kernels), check, self.model_ms, self.plugged_ms, use)


class VerificationResult(_Strict):
    model: str = Field(pattern=_NAME)
    device: Literal["cpu", "cuda"]
    dtype: str = Field(pattern=r"^[a-z0-9_]{1,20}$")
    error_factor: float
    reps: int = Field(ge=1)
    ok: bool
    origins: dict[str, str]
    total: TrialResult
    alone: list[TrialResult] = Field(max_length=1000)

    def for_job(self, job: VerifyJob) -> Verification:
        """The verification, where it is one of ``job``: its device and settings, its kernels
        by name; the origins shown are the job's own."""
        names = [k.problem().name for k in job.kernels]
        origins = {name: k.origin for name, k in zip(names, job.kernels)}
        if self.device != job.device or self.reps != job.reps or self.error_factor != job.factor:
            raise ValueError("its device or settings are not the job's")
        for t in (self.total, *self.alone):
            if not set(t.kernels) <= set(names) or set(t.use) != set(t.kernels):
                raise ValueError("it names kernels the job does not have")
        if self.total.kernels != names or len(self.alone) != (len(names) if job.diagnose else 0):
            raise ValueError("its trials are not the job's")
        return Verification(
            self.model,
            self.device,
            self.dtype,
            self.error_factor,
            self.reps,
            self.total.to_trial(),
            [t.to_trial() for t in self.alone],
            origins,
        )
