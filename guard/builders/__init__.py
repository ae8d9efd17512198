"""Builders, one per language family, behind one interface (they run inside a worker).

``get_builder(language)`` returns the builder; ``builder.build(...)`` returns the callable
entry point or raises ``BuildError`` with a message trimmed to what matters.
"""

from __future__ import annotations

from .base import BuildError, Builder
from .cuda_cpp import CudaCppBuilder
from .cute_dsl import CuteDslBuilder
from .cutile import CutileBuilder
from .dsl import DslBuilder, refusal
from .python import PythonBuilder
from .tilelang import TileLangBuilder

_REGISTRY: dict[str, Builder] = {}


def register(builder: Builder) -> None:
    for lang in builder.languages:
        _REGISTRY[lang] = builder


register(PythonBuilder())
register(CudaCppBuilder())
for _dsl in (CuteDslBuilder(), CutileBuilder(), TileLangBuilder()):
    register(_dsl)


def dsl_refusal(language: str, device_kind: str) -> str | None:
    """Why this guard cannot judge ``language`` (a DSL whose package is missing, or a CPU
    guard), or None: checked before a candidate is recorded, so it is refused, not rejected.
    The GPU's own support is checked in the worker, where the GPU is known."""
    builder = _REGISTRY.get(language)
    if isinstance(builder, DslBuilder):
        return refusal(builder.requirement, device_kind)
    return None


def get_builder(language: str) -> Builder:
    try:
        return _REGISTRY[language]
    except KeyError:
        raise BuildError(f"no builder for language {language!r}") from None


__all__ = ["BuildError", "Builder", "dsl_refusal", "get_builder", "register"]
