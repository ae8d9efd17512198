"""Comments and string literals of C, C++ and CUDA sources, found in one linear pass.

Regular expressions such as ``/\\*.*?\\*/`` take quadratic time on an unclosed comment (each
``/*`` scans to the end of the text), and they ran in the guard's own process over sources an
agent wrote: 256 KB of ``/*a`` took 135 s there, holding its other threads (red team, session
42). Here each character is looked at a bounded number of times."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

_START = re.compile(r"//|/\*|\"|'")
# a literal's rest: escapes and other characters up to its closing quote on the line
# (alternatives that cannot both match a character, so no backtracking)
_REST = {
    '"': re.compile(r'(?:\\.|[^"\\\n])*"'),
    "'": re.compile(r"(?:\\.|[^'\\\n])*'"),
}

Kind = Literal["comment", "string"]


def spans(source: str) -> Iterator[tuple[int, int, Kind]]:
    """(start, end, kind) of each comment and string or character literal, in order. An
    unclosed block comment runs to the end of the text. A quote that does not close on its
    line is no literal: the rest of that line is code (blanking it hid a call after a ``'"'``
    from the screen), and the scan goes on from the next line, so a line of quotes is read
    once."""
    i = 0
    while (m := _START.search(source, i)) is not None:
        start, token = m.start(), m.group()
        kind: Kind = "comment"
        if token == "//":
            end = source.find("\n", start)
            end = len(source) if end < 0 else end
        elif token == "/*":
            end = source.find("*/", start + 2)
            end = len(source) if end < 0 else end + 2
        else:
            rest = _REST[token].match(source, start + 1)
            if rest is None:  # unclosed: code; go on after this line
                eol = source.find("\n", start)
                i = len(source) if eol < 0 else eol + 1
                continue
            end, kind = rest.end(), "string"
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
    """``source`` with every comment and the inside of every literal blanked, newlines kept:
    the same length and offsets, so positions found in it hold in ``source``."""
    out, last = [], 0
    for start, end, kind in spans(source):
        out.append(source[last:start])
        if kind == "comment":
            out.append(_blank(source[start:end]))
        else:  # its quotes stay
            out.append(source[start] + _blank(source[start + 1 : end - 1]) + source[end - 1])
        last = end
    out.append(source[last:])
    return "".join(out)


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)
