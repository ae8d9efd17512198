"""Turn what a user or agent submits into a ``Solution``.

A single ``.py`` defines ``run(...)`` with the reference's signature and returns the
outputs (PyTorch, Triton, or CUDA launched through cuda-python). A single ``.cu``/``.cpp``
file defines ``run`` with a torch binding (its own ``PYBIND11_MODULE`` or one the guard
generates). A ``solution.json`` is taken as SOL-ExecBench defines it.

A ``.py`` that defines ``class ModelNew`` and no top-level ``run`` is a candidate as
KernelBench writes them: its entry point is ``file::ModelNew``, which the Python builder wraps,
in the candidate worker, in a ``run(...)`` with the problem's inputs (``guard/builders/modelnew.py``;
only problems imported from KernelBench take one). Nothing of it runs here: the source is
only parsed.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from ..pyparse import parse
from .solution import CPP_SUFFIXES, Solution, normalize_language


# The import that marks a one-file candidate as written in a DSL with a builder of its own.
DSL_IMPORTS = (
    ("cute_dsl", r"^\s*(import\s+cutlass\b|from\s+cutlass\b)"),
    ("cutile", r"^\s*(import\s+cuda\.tile\b|from\s+cuda\.tile\b|from\s+cuda\s+import\s+tile\b)"),
    ("tilelang", r"^\s*(import|from)\s+tilelang\b"),
)


class CandidateError(ValueError):
    """A submission that is not a candidate at all (unreadable, unknown kind)."""


def guess_language(source: str, filename: str) -> str:
    suffix = PurePosixPath(filename).suffix
    if suffix in CPP_SUFFIXES:
        return "cuda_cpp"
    for lang, pattern in DSL_IMPORTS:
        if re.search(pattern, source, re.M):
            return lang
    if re.search(r"^\s*(import|from)\s+triton\b", source, re.M):
        return "triton"
    return "pytorch"


def top_level_names(source: str) -> set[str] | None:
    """Names a Python source binds at its top level (defs, classes, assignments, imports);
    None when it does not parse (the screen reports that, with the line)."""
    try:
        tree = parse(source)  # behind the parser's lock: a server screens on several threads
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def is_modelnew_source(source: str) -> bool:
    """KernelBench's candidate form: ``ModelNew`` defined at the top level, no ``run``."""
    names = top_level_names(source)
    return names is not None and "ModelNew" in names and "run" not in names


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
        if (
            lang == "cuda_cpp"
            and PurePosixPath(filename or "kernel.py").suffix not in CPP_SUFFIXES
            and is_modelnew_source(source)
        ):
            lang = "pytorch"  # a ModelNew whose kernel is CUDA through load_inline is Python
    else:
        lang = guess_language(source, filename or "kernel.py")
    if filename is None:
        filename = "kernel.cu" if lang == "cuda_cpp" else "kernel.py"
    filename = PurePosixPath(filename).name
    if filename.startswith("."):  # a hidden file's name is no source path (``check_source_path``)
        filename = "kernel.cu" if lang == "cuda_cpp" else "kernel.py"
    if lang == "cuda_cpp" and PurePosixPath(filename).suffix not in CPP_SUFFIXES:
        filename = "kernel.cu"
    if lang != "cuda_cpp" and not filename.endswith(".py"):
        filename = "kernel.py"
    languages = [lang] if lang != "triton" else ["triton", "pytorch"]
    symbol = "ModelNew" if lang != "cuda_cpp" and is_modelnew_source(source) else "run"
    try:
        return Solution.model_validate(
            {
                "name": name,
                "author": author,
                "spec": {
                    "languages": languages,
                    "entry_point": f"{filename}::{symbol}",
                    "destination_passing_style": False,
                    "binding": "torch" if lang == "cuda_cpp" else None,
                },
                "sources": [{"path": filename, "content": source}],
            }
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
