"""``ast.parse`` behind one lock. CPython 3.11's parser is not safe when two threads parse at
once ("SystemError: AST constructor recursion depth mismatch", seen when two devices screened
candidates together), and a server judges on one thread per device."""

from __future__ import annotations

import ast
import threading
from typing import Literal, overload

_LOCK = threading.Lock()


@overload
def parse(source: str, filename: str = "<unknown>", mode: Literal["exec"] = "exec") -> ast.Module: ...
@overload
def parse(source: str, filename: str = "<unknown>", *, mode: Literal["eval"]) -> ast.Expression: ...


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
