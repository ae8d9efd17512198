"""TileLang (package tilelang): a ``.py`` candidate that writes its kernels with
``tilelang.language``, compiles them with ``tilelang.compile`` (or ``@tilelang.jit``) and calls
them on torch tensors. Not a SOL-ExecBench language: such a solution cannot be exported to that
benchmark's solution schema."""

from __future__ import annotations

from .dsl import DslBuilder, Requirement

REQUIREMENT = Requirement(language="tilelang", title="TileLang", package="tilelang", module="tilelang")


class TileLangBuilder(DslBuilder):
    requirement = REQUIREMENT
