"""Compiler and traceback output trimmed to the lines an agent can act on."""

from __future__ import annotations

import re
import traceback
from collections.abc import Sequence
from pathlib import Path

_ERROR_LINE = re.compile(r"(error|Error|ERROR)[:\s]|undefined reference|fatal")
_NOISE = re.compile(r"^\[\d+/\d+\]|^FAILED:|-isystem|^ninja: |^c\+\+ |^/usr/\S*nvcc ")


def trim_compiler_output(text: str, build_dirs: Sequence[Path] = (), max_lines: int = 30) -> str:
    for d in build_dirs:
        text = text.replace(str(d) + "/", "")
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not _NOISE.search(ln)]
    keep: list[str] = []
    i = 0
    while i < len(lines) and len(keep) < max_lines:
        if _ERROR_LINE.search(lines[i]):
            keep.append(lines[i])
            # the source line and caret nvcc/gcc print after an error
            for ctx in lines[i + 1 : i + 3]:
                if not _ERROR_LINE.search(ctx) and len(ctx) < 300:
                    keep.append(ctx)
            i += 3
        else:
            i += 1
    if not keep:
        keep = lines[-max_lines:]
    out = "\n".join(keep[:max_lines])
    return out[:4000]


def trim_traceback(exc: BaseException, candidate_dirs: list[Path], limit: int = 12) -> str:
    """The exception, then the candidate's frames without the guard's own: the first line,
    which a verdict's reason shows, says what failed rather than where."""
    frames = traceback.extract_tb(exc.__traceback__)
    dirs = [str(d) for d in candidate_dirs]
    mine = [f for f in frames if any(f.filename.startswith(d) for d in dirs)]
    lines = []
    for f in (mine or frames[-3:])[-limit:]:
        name = Path(f.filename).name if any(f.filename.startswith(d) for d in dirs) else f.filename
        lines.append(f'  File "{name}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line.strip()}")
    msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if len(msg) > 2000:
        msg = msg[:2000] + " ..."
    return "\n".join([msg] + lines)
