"""Our pydantic model of SOL-ExecBench's published solution schema (``docs/solution.md`` and
``core/data/solution.py`` of NVIDIA/SOL-ExecBench, read, not copied), and the export of a
stored candidate into it.

The guard's own ``guard.candidates.solution.Solution`` is lenient on input (older spellings,
a C++ entry point that names a module); this model is the published schema, strict, so that an
exported ``solution.json`` is one SOL-ExecBench's loader takes. An exported solution loads back
into the guard unchanged: same languages, entry point, flags and sources, so the same source
hash (``tests/test_sol_export.py``).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..candidates.solution import CPP_SUFFIXES
from ..candidates.solution import Solution as GuardSolution

NonEmpty = Annotated[str, Field(min_length=1)]
PYTHON_LANGUAGES = ("pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend")
CPP_LANGUAGES = ("cutlass", "cudnn", "cublas", "cuda_cpp")
Language = Literal[
    "pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend", "cutlass", "cudnn", "cublas", "cuda_cpp"
]


Hardware = Literal["B200", "LOCAL"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceFile(_Strict):
    path: NonEmpty
    content: NonEmpty

    @model_validator(mode="after")
    def _relative(self) -> "SourceFile":
        p = PurePosixPath(self.path)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError(f"source path {self.path!r} must be relative, without '..'")
        return self


class CompileOptions(_Strict):
    cflags: list[str] = Field(default_factory=list)
    cuda_cflags: list[str] = Field(default_factory=lambda: ["-O3", "--use_fast_math"])
    ld_flags: list[str] = Field(default_factory=lambda: ["-lcuda"])


class BuildSpec(_Strict):
    languages: list[Language]
    target_hardware: list[Hardware] = Field(min_length=1)
    entry_point: NonEmpty
    dependencies: list[NonEmpty] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Literal["torch"] | None = None
    compile_options: CompileOptions | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "BuildSpec":
        if self.entry_point.count("::") != 1:
            raise ValueError(f"entry_point {self.entry_point!r} must be 'file::function'")
        py = [x for x in self.languages if x in PYTHON_LANGUAGES]
        cpp = [x for x in self.languages if x in CPP_LANGUAGES]
        if py and cpp:
            raise ValueError(f"C++ and Python languages cannot be mixed: {cpp} and {py}")
        suffix = PurePosixPath(self.entry_point.split("::")[0]).suffix
        if cpp and suffix not in CPP_SUFFIXES:
            raise ValueError(f"a C++ solution's entry file must be C++/CUDA, not {suffix!r}")
        if py and suffix != ".py":
            raise ValueError(f"a Python solution's entry file must be .py, not {suffix!r}")
        return self


class SolSolution(_Strict):
    name: NonEmpty
    definition: NonEmpty
    author: NonEmpty
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)
    description: str | None = None

    @model_validator(mode="after")
    def _entry_among_sources(self) -> "SolSolution":
        paths = [s.path for s in self.sources]
        if len(set(paths)) != len(paths):
            raise ValueError("duplicate source paths")
        entry = self.spec.entry_point.split("::")[0]
        if entry not in paths:
            raise ValueError(f"entry file {entry!r} is not among the sources")
        return self


def export_solution(solution: GuardSolution, name: str, definition: str, author: str) -> SolSolution:
    """The published form of a stored candidate. Languages, entry point, destination passing,
    binding, compile options and sources are carried as they are; fields the guard does not
    use (target hardware, dependencies) keep what the candidate said, or the schema's
    defaults."""
    spec = solution.spec
    extra = solution.model_extra or {}
    hardware = [h.upper() if h.upper() in ("B200", "LOCAL") else "LOCAL" for h in spec.target_hardware]
    return SolSolution(
        name=name,
        definition=definition,
        author=author or "unknown",
        description=solution.description or extra.get("description"),
        spec=BuildSpec(
            languages=cast("list[Language]", list(spec.languages)),
            target_hardware=cast("list[Hardware]", list(dict.fromkeys(hardware)) or ["LOCAL"]),
            entry_point=spec.entry_point,
            dependencies=list(spec.dependencies),
            destination_passing_style=spec.destination_passing_style,
            binding="torch" if spec.primary_language in CPP_LANGUAGES else None,
            compile_options=(
                CompileOptions.model_validate(spec.compile_options.model_dump())
                if spec.compile_options is not None
                else None
            ),
        ),
        sources=[SourceFile(path=s.path, content=s.content) for s in solution.sources],
    )
