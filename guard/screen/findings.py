from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    rule: str
    message: str

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file or "sources"
        return f"{where}: {self.message} [{self.rule}]"
