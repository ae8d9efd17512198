"""Text from agents' code or files, made safe to show: on a terminal, an escape sequence in a
name can clear the screen, retitle the window or set the clipboard, and a carriage return can
rewrite the line it is in (red team, session 43). What is not a printable character (control
characters, C1 codes, bidirectional overrides, zero-width marks: Python's ``str.isprintable``)
is shown as ``?``."""

from __future__ import annotations


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (or in ``keep``) replaced by ``?``."""
    return "".join(ch if ch.isprintable() or ch in keep else "?" for ch in text)
