"""Builders, one per language family, behind one interface (they run inside a worker).

``get_builder(language)`` returns the builder; ``builder.build(...)`` returns the callable
entry point or raises ``BuildError`` with a message trimmed to what matters.
"""

from __future__ import annotations

from .base import BuildError, Builder
from .cuda_cpp import CudaCppBuilder
from .python import PythonBuilder

_REGISTRY: dict[str, Builder] = {}


def register(builder: Builder) -> None:
    for lang in builder.languages:
        _REGISTRY[lang] = builder


register(PythonBuilder())
register(CudaCppBuilder())


def get_builder(language: str) -> Builder:
    try:
        return _REGISTRY[language]
    except KeyError:
        raise BuildError(f"no builder for language {language!r}") from None


__all__ = ["BuildError", "Builder", "get_builder", "register"]
