"""CuTe DSL (CUTLASS's Python DSL, package nvidia-cutlass-dsl): a ``.py`` candidate that
imports ``cutlass.cute``, compiles its kernels with ``cute.compile`` and launches them on torch
tensors passed through DLPack. Its documentation lists Ampere, Hopper and Blackwell GPUs; the
guard asks only for a CUDA GPU and lets the DSL say more at build time."""

from __future__ import annotations

from .dsl import DslBuilder, Requirement

REQUIREMENT = Requirement(language="cute_dsl", title="CuTe DSL", package="nvidia-cutlass-dsl", module="cutlass")


class CuteDslBuilder(DslBuilder):
    requirement = REQUIREMENT
