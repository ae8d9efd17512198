"""Comments and string literals of C, C++ and CUDA sources, found in one linear pass.

Regular expressions such as ``/\\*.*?\\*/`` take quadratic time on an unclosed comment (each
``/*`` scans to the end of the text), and they ran in the guard's own process over sources an
agent wrote: 256 KB of ``/*a`` took 135 s there, holding its other threads (red team, session
42). Here each character is looked at a bounded number of times."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

_START = re.compile(r'//|/\*|"')
# a string literal's rest: escapes and other characters up to its closing quote on the line
# (alternatives that cannot both match a character, so no backtracking)
_STRING_REST = re.compile(r'(?:\\.|[^"\\\n])*("?)')

Kind = Literal["comment", "string"]


def spans(source: str) -> Iterator[tuple[int, int, Kind]]:
    """(start, end, kind) of each comment and string literal, in order. An unclosed block
    comment runs to the end of the text, an unclosed string to the end of its line."""
    i = 0
    while (m := _START.search(source, i)) is not None:
        start, token = m.start(), m.group()
        if token == "//":
            end = source.find("\n", start)
            end = len(source) if end < 0 else end
            kind: Kind = "comment"
        elif token == "/*":
            end = source.find("*/", start + 2)
            end = len(source) if end < 0 else end + 2
            kind = "comment"
        else:
            rest = _STRING_REST.match(source, start + 1)
            end = rest.end() if rest is not None else start + 1
            kind = "string"
        yield start, end, kind
        i = end


def without_comments(source: str) -> str:
    """``source`` with its comments removed (string literals kept whole)."""
    parts, last = [], 0
    for start, end, kind in spans(source):
        if kind == "comment":
            parts.append(source[last:start])
            last = end
    parts.append(source[last:])
    return "".join(parts)


def blanked(source: str) -> str:
    """``source`` with every comment and the inside of every string literal blanked, newlines
    kept: the same length and line numbers."""
    out, last = [], 0
    for start, end, kind in spans(source):
        out.append(source[last:start])
        if kind == "comment":
            out.append(_blank(source[start:end]))
        else:  # its quotes stay
            rest = _STRING_REST.match(source, start + 1)
            closed = rest is not None and rest.group(1) == '"'
            out.append('"' + _blank(source[start + 1 : end - 1 if closed else end]) + ('"' if closed else ""))
        last = end
    out.append(source[last:])
    return "".join(out)


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)
