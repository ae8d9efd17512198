"""Verdicts stored by earlier versions (``verdict_json`` in the workspace database) still
load, and give back the same JSON."""

from __future__ import annotations

import json

import pytest

from conftest import DATA
from guard.verdict import Verdict

STORED = sorted((DATA / "verdicts").glob("*.json"))


def load(name: str) -> Verdict:
    return Verdict.model_validate_json((DATA / "verdicts" / f"{name}.json").read_text())


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_a_stored_verdict_loads_and_keeps_its_shape(path):
    text = path.read_text()
    v = Verdict.model_validate_json(text)
    assert json.loads(v.model_dump_json()) == json.loads(text)


def test_a_verdict_without_ceilings_keeps_its_shape():
    # a verdict given before the device's ceilings were measured has none
    raw = json.loads((DATA / "verdicts" / "rejected_screen.json").read_text())
    del raw["device"]["ceilings"]
    assert json.loads(Verdict.model_validate(raw).model_dump_json()) == raw
