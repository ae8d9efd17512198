"""Gate 1, the static screen: size limits, parse, banned constructs. Pure Python, no torch.

The screen is a first line only. Every cheat it looks for is also caught at run time in the
worker (integrity checks, isolation of the reference), so obfuscated code that slips past
it still fails; the screen's job is to fail fast with the line to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..candidates.solution import CPP_SUFFIXES, Solution
from . import cpp_rules, python_rules
from .findings import Finding


@dataclass
class ScreenResult:
    findings: list[Finding] = field(default_factory=list)
    status: str = "PASSED"  # or COMPILE_ERROR / REWARD_HACK

    @property
    def ok(self) -> bool:
        return not self.findings

    def message(self, limit: int = 5) -> str:
        lines = [f.render() for f in self.findings[:limit]]
        if len(self.findings) > limit:
            lines.append(f"... and {len(self.findings) - limit} more")
        return "\n".join(lines)


def screen_solution(solution: Solution, max_bytes: int, max_files: int) -> ScreenResult:
    if len(solution.sources) > max_files:
        return ScreenResult(
            [Finding("", 0, "size", f"{len(solution.sources)} source files; at most {max_files}")],
            "COMPILE_ERROR",
        )
    total = solution.total_bytes()
    if total > max_bytes:
        return ScreenResult(
            [Finding("", 0, "size", f"sources are {total} bytes; at most {max_bytes}")],
            "COMPILE_ERROR",
        )
    findings: list[Finding] = []
    for src in solution.sources:
        suffix = PurePosixPath(src.path).suffix
        if suffix == ".py":
            foreign = python_rules.foreign_encoding(src.path, src.content)
            if foreign:
                return ScreenResult([foreign], "REWARD_HACK")
            syntax = python_rules.syntax_error(src.path, src.content)
            if syntax:
                return ScreenResult([syntax], "COMPILE_ERROR")
            findings += python_rules.check(src.path, src.content)
        elif suffix in CPP_SUFFIXES:
            findings += cpp_rules.check(src.path, src.content)
        # other files (headers of other kinds, data) are not executed directly
    return ScreenResult(findings, "REWARD_HACK" if findings else "PASSED")
