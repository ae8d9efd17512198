"""The SOL-ExecBench ``solution.json`` schema, as far as the guard uses it."""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Language = Literal["pytorch", "triton", "cuda_cpp", "cute_dsl", "cutile", "tilelang"]
# Python DSLs with a builder of their own (guard/builders/dsl.py), in the order that decides a
# solution's primary language when it names several.
DSL_LANGUAGES = ("cute_dsl", "cutile", "tilelang")
PYTHON_LANGUAGES = {"pytorch", "triton", *DSL_LANGUAGES}
LANGUAGES = ("pytorch", "triton", "cuda_cpp", *DSL_LANGUAGES)
# Older spellings and C++ families that build the same way as cuda_cpp.
LANGUAGE_ALIASES = {
    "python": "pytorch",
    "torch": "pytorch",
    "cuda": "cuda_cpp",
    "cpp": "cuda_cpp",
    "cutlass": "cuda_cpp",
    "cublas": "cuda_cpp",
    "cudnn": "cuda_cpp",
    "cutedsl": "cute_dsl",
    "cute-dsl": "cute_dsl",
    "cuda_tile": "cutile",
    "cuda-tile": "cutile",
    "tile_lang": "tilelang",
}
CPP_SUFFIXES = {".cu", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cuh"}


def framed(text: str) -> bytes:
    """``text`` as bytes behind its length: parts hashed one after another so can never run
    into each other (joined by NUL alone, a content holding NUL could pose as the next file's
    name, and two solutions had one hash; red team, session 42)."""
    data = text.encode()
    return len(data).to_bytes(8, "little") + data


def normalize_language(name: str) -> str:
    name = name.strip().lower()
    name = LANGUAGE_ALIASES.get(name, name)
    if name not in LANGUAGES:
        raise ValueError(f"unsupported language {name!r}: use {', '.join(LANGUAGES)}")
    return name


MAX_PATH_CHARS = 200
MAX_PATH_DEPTH = 8


def check_source_path(path: str) -> str:
    """``path`` if it is a source path the guard will write: relative, in normal form (one name
    per file, so two entries cannot name one file and let their order decide what runs), and
    no name that starts with a dot. The guard's own process writes accepted sources into the
    workspace's git archive, where a ``.git`` folder of the agent's making would be a
    repository whose configuration runs commands for whoever uses git there."""
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"invalid source path {path[:MAX_PATH_CHARS]!r}: 1 to {MAX_PATH_CHARS} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 or ch == "\\" for ch in path):
        raise ValueError(f"invalid source path {path!r}: no backslash or control character")
    names = path.split("/")
    if path.startswith("/") or len(names) > MAX_PATH_DEPTH or "" in names:
        raise ValueError(
            f"invalid source path {path!r}: relative, at most {MAX_PATH_DEPTH} names, none empty (no '//')"
        )
    for name in names:
        if name.startswith("."):
            raise ValueError(
                f"invalid source path {path!r}: no name may start with '.' ({name!r}; "
                "'.', '..' and hidden files such as '.git' are refused)"
            )
    return path


class SourceFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_source_path(v)


class CompileOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    cflags: list[str] = Field(default_factory=list)
    cuda_cflags: list[str] = Field(default_factory=list)
    ld_flags: list[str] = Field(default_factory=list)


class BuildSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    languages: list[str] = Field(default_factory=list)
    language: str | None = None  # older single-language spelling
    target_hardware: list[str] = Field(default_factory=lambda: ["LOCAL"])
    entry_point: str
    dependencies: list[str] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: str | None = None
    compile_options: CompileOptions | None = None

    @model_validator(mode="after")
    def _normalize(self) -> "BuildSpec":
        langs = list(self.languages) or ([self.language] if self.language else [])
        if not langs:
            raise ValueError("spec.languages is empty")
        self.languages = sorted({normalize_language(x) for x in langs})
        if "cuda_cpp" in self.languages and len(self.languages) > 1:
            raise ValueError("C++ and Python languages cannot be mixed in one solution")
        if self.entry_point.count("::") != 1:
            raise ValueError(f"entry_point {self.entry_point!r} must be 'file::function'")
        return self

    @property
    def primary_language(self) -> str:
        """The builder's language: C++, else a DSL the solution names, else Triton, else PyTorch."""
        if "cuda_cpp" in self.languages:
            return "cuda_cpp"
        for dsl in DSL_LANGUAGES:
            if dsl in self.languages:
                return dsl
        return "triton" if "triton" in self.languages else "pytorch"


class Solution(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = "candidate"
    definition: str = ""
    author: str = "unknown"
    description: str | None = None
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)

    @model_validator(mode="after")
    def _entry_exists(self) -> "Solution":
        paths = [s.path for s in self.sources]
        if len(set(paths)) != len(paths):
            raise ValueError("duplicate source paths")
        entry_file, symbol = self.spec.entry_point.split("::")
        if not symbol.isidentifier():
            raise ValueError(f"entry symbol {symbol!r} is not an identifier")
        if self.spec.primary_language == "cuda_cpp":
            # SOL-ExecBench's torch binding names a module, not a file: accept either.
            return self
        if entry_file not in paths:
            raise ValueError(f"entry file {entry_file!r} is not among the sources")
        if PurePosixPath(entry_file).suffix != ".py":
            raise ValueError("Python languages need a .py entry file")
        return self

    @property
    def entry_file(self) -> str:
        return self.spec.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        return self.spec.entry_point.split("::")[1]

    def source_hash(self) -> str:
        """Identity of what runs: languages, entry point, DPS flag, flags and sources."""
        h = hashlib.sha256()
        parts = [
            ",".join(self.spec.languages),
            self.spec.entry_point,
            str(self.spec.destination_passing_style),
            self.spec.compile_options.model_dump_json() if self.spec.compile_options else "",
        ]
        for src in sorted(self.sources, key=lambda s: s.path):
            parts += [src.path, src.content]
        for part in parts:
            h.update(framed(part))
        return h.hexdigest()

    def total_bytes(self) -> int:
        return sum(len(s.content.encode()) for s in self.sources)
