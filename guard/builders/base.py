from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class BuildError(Exception):
    """The candidate did not build. ``status`` is the trace status to report."""

    def __init__(self, message: str, status: str = "COMPILE_ERROR"):
        super().__init__(message)
        self.status = status


class Builder(Protocol):
    @property
    def languages(self) -> tuple[str, ...]: ...

    def build(self, solution: dict[str, Any], srcdir: Path, builddir: Path, device: str) -> Callable[..., Any]:
        """Build ``solution`` whose sources are already written under ``srcdir``."""
        ...


def write_sources(solution: dict[str, Any], srcdir: Path) -> list[Path]:
    paths = []
    for src in solution["sources"]:
        path = (srcdir / src["path"]).resolve()
        if srcdir.resolve() not in path.parents:
            raise BuildError(f"source path {src['path']!r} leaves the build folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src["content"])
        paths.append(path)
    return paths
