"""Strings that come from agents (names, paths, notes) are shown printable: a table cell with
an escape sequence once cleared the terminal and set its clipboard (red team, session 43)."""

from __future__ import annotations

import io
import re

from guard.printable import printable
from kernelarc_mcp import render
from wholemodel import tables

HOSTILE = "agent_out/dl\x1b]52;c;Y3VybCB4fHNo\x07\x1b[2K\rreviewed\u202e.py"


def test_a_table_shows_no_control_character():
    out = io.StringIO()
    render.table(["from"], [[HOSTILE]], out=out)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "reviewed" in text


def test_a_markdown_cell_has_no_markup_of_its_own():
    md = tables.markdown((["kernel", "from"], [["k_1", "x<img src=https://e.invalid/a.png>|[a](https://e.invalid)"]]))
    row = md.splitlines()[-1]
    unescaped = re.compile(r"(?<!\\)[<>\[\]|]")
    assert [m.group() for m in unescaped.finditer(row)] == ["|", "|", "|"], row  # the cells' own bars only
    assert "k_1" in row  # names stay as they are


def test_printable_keeps_what_is_asked():
    assert printable("a\tb\x1bc", keep="\t") == "a\tb?c"
