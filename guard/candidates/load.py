"""Turn what a user or agent submits into a ``Solution``.

A single ``.py`` defines ``run(...)`` with the reference's signature and returns the
outputs (PyTorch, Triton, or CUDA launched through cuda-python). A single ``.cu``/``.cpp``
file defines ``run`` with a torch binding (its own ``PYBIND11_MODULE`` or one the guard
generates). A ``solution.json`` is taken as SOL-ExecBench defines it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from .solution import CPP_SUFFIXES, Solution, normalize_language


class CandidateError(ValueError):
    """A submission that is not a candidate at all (unreadable, unknown kind)."""


def guess_language(source: str, filename: str) -> str:
    suffix = PurePosixPath(filename).suffix
    if suffix in CPP_SUFFIXES:
        return "cuda_cpp"
    if re.search(r"^\s*(import|from)\s+triton\b", source, re.M):
        return "triton"
    return "pytorch"


def from_source(
    source: str,
    language: str | None = None,
    filename: str | None = None,
    name: str = "candidate",
    author: str = "unknown",
) -> Solution:
    """A one-file solution from source text."""
    if not isinstance(source, str) or not source.strip():
        raise CandidateError("the source is empty")
    if language:
        lang = normalize_language(language)
    else:
        lang = guess_language(source, filename or "kernel.py")
    if filename is None:
        filename = "kernel.cu" if lang == "cuda_cpp" else "kernel.py"
    filename = PurePosixPath(filename).name
    if lang == "cuda_cpp" and PurePosixPath(filename).suffix not in CPP_SUFFIXES:
        filename = "kernel.cu"
    if lang != "cuda_cpp" and not filename.endswith(".py"):
        filename = "kernel.py"
    languages = [lang] if lang != "triton" else ["triton", "pytorch"]
    try:
        return Solution(
            name=name,
            author=author,
            spec={
                "languages": languages,
                "entry_point": f"{filename}::run",
                "destination_passing_style": False,
                "binding": "torch" if lang == "cuda_cpp" else None,
            },
            sources=[{"path": filename, "content": source}],
        )
    except ValidationError as exc:
        raise CandidateError(str(exc.errors()[0]["msg"])) from None


def from_solution_json(text: str) -> Solution:
    try:
        return Solution.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise CandidateError(f"solution.json is not valid JSON: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise CandidateError(f"solution.json: {loc}: {err['msg']}") from None


def from_file(path: Path, language: str | None = None) -> Solution:
    path = Path(path)
    if not path.is_file():
        raise CandidateError(f"{path}: no such file")
    if path.stat().st_size > 4_000_000:
        raise CandidateError(f"{path}: larger than 4 MB")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise CandidateError(f"{path}: not UTF-8 text") from None
    if path.suffix == ".json":
        return from_solution_json(text)
    if path.suffix != ".py" and path.suffix not in CPP_SUFFIXES:
        raise CandidateError(f"{path}: expected .py, .cu, .cpp or solution .json")
    return from_source(text, language, path.name, name=path.stem)
