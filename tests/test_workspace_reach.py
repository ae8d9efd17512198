"""Cheats that reach for the workspace (``tests/cheats/workspace_*.py``) leave it untouched and
learn nothing of its secret, after a full ``Guard.evaluate``.

Per cheat: ``secret.key`` byte for byte the same, ``workspace.db`` the same file (not deleted
or replaced) whose earlier rows (candidates, per-workload results, baselines) are unchanged,
and the secret's hex nowhere in the verdict (reason, diagnostic: what the worker said) or in
what the guard stored of it. The raw bytes of the database are not compared: the evaluation
itself adds the cheat's own rows. Earlier results of another agent are made first, on both
problems the cheats run on, so that a cheat that rewrites results has something to rewrite.

These fail while candidate workers can reach the guard's process (/proc of their parent),
the workspace's files, or have the guard act on a file name they send (the guard unlinks,
and the trusted worker reads, the output files a candidate's reply names).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import uuid

import pytest

from guard.candidates.load import from_source

from helpers import CHEATS, REPO, RMS, SOL_EXAMPLES, cheat_source, expectation, honest_source, make_guard, unique

WORKSPACE_CHEATS = sorted(CHEATS.glob("workspace_*.py"))
SOFTMAX = "softmax_h4096"
HONEST_SOFTMAX = "import torch\n\n\ndef run(input):\n    return torch.softmax(input, dim=-1)\n"
# table -> the columns that identify a row
TABLES = {
    "candidates": ("id",),
    "workload_results": ("candidate_id", "workload"),
    "baselines": ("definition_hash", "workload", "device_key"),
}


@pytest.fixture(scope="module")
def other_workspace():
    """Another workspace on the machine, kept in the project's checkout as the demo's is, with
    nothing to do with the evaluations judged here: no candidate may read it either (red
    team, session 39: the checkout was bound whole, and only the judged workspace masked)."""
    from guard.workspace import Workspace

    root = REPO / f".kernelarc-other-{uuid.uuid4().hex[:8]}"
    try:
        ws = Workspace.open(root)
        assert len(ws.secret) == 32  # made now, as a workspace in use has it
        yield ws
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def reach_guard(other_workspace):
    # In the project's folder, as the demo's workspace is, beside another one: a workspace
    # there is hidden behind a mask that a cheat may try to take away.
    root = REPO / f".kernelarc-reach-{uuid.uuid4().hex[:8]}"
    try:
        yield from _reach_guard(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(root.parent / f"{root.name}-src", ignore_errors=True)


HELDOUT_UUID = "held-out-c0ffee"  # a workload of an imported problem's own held-out file


def _with_heldout(folder, tmp):
    """A copy of the SOL example ``folder`` with an explicit held-out workload, as a problem
    that ships its own held-out set has them."""
    import json

    copy = tmp / f"{folder.name}_heldout"
    shutil.copytree(folder, copy)
    definition = json.loads((copy / "definition.json").read_text())
    definition["name"] = copy.name
    (copy / "definition.json").write_text(json.dumps(definition))
    from helpers import write_safetensors

    row = json.loads((copy / "workload.jsonl").read_text().splitlines()[0])
    row["uuid"] = HELDOUT_UUID
    # its input stored in a file whose header gives the held-out shape (and, here, its name)
    row["inputs"] = {"input": {"type": "safetensors", "path": "blobs/held.safetensors", "tensor_key": "input"}}
    write_safetensors(copy / "blobs" / "held.safetensors", {"input": [7, 4096]}, {"workload": HELDOUT_UUID})
    (copy / "heldout.jsonl").write_text(json.dumps(row) + "\n")
    return copy


def _reach_guard(root):
    g = make_guard(root, static_screen=False, call_timeout_s=10)
    g.store.import_path(SOL_EXAMPLES / SOFTMAX)  # an imported problem: it lives in the workspace
    # and one with held-out workloads of its own, which no candidate may read
    imported, _ = g.store.import_path(_with_heldout(SOL_EXAMPLES / SOFTMAX, root.parent / f"{root.name}-src"))
    assert [w.uuid for w in g.store.get(imported.name).heldout] == [HELDOUT_UUID]
    assert not list(g.ws.problems_dir.rglob("heldout.jsonl"))
    assert not list(g.ws.problems_dir.rglob("*.safetensors"))
    for problem, source in ((RMS, honest_source()), (SOFTMAX, unique(HONEST_SOFTMAX))):
        for _ in range(3):  # a measured result is needed; a loaded machine can upset one timing
            v = g.evaluate(from_source(unique(source), None, "kernel.py"), problem, agent="earlier")
            if v.status == "PASSED":
                break
        assert v.status == "PASSED", v.reason
    yield g
    g.close()


def _rows(db_path) -> dict:
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        out = {}
        for table, key in TABLES.items():
            for r in con.execute(f"SELECT * FROM {table}"):
                out[(table, *(r[k] for k in key))] = tuple(r)
        return out
    finally:
        con.close()


def _sha(path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.mark.parametrize("path", WORKSPACE_CHEATS, ids=lambda p: p.stem)
def test_workspace_untouched_and_secret_unknown(reach_guard, other_workspace, path):
    g = reach_guard
    root = g.ws.root
    secret_file, db_file = root / "secret.key", g.ws.db_path
    secret_bytes = secret_file.read_bytes()
    secret_hex = g._secret.hex()
    assert secret_bytes.decode().strip() == secret_hex
    other_hex = other_workspace.secret.hex()
    before_rows = _rows(db_file)
    before_inode = os.stat(db_file).st_ino
    exp = expectation(path)
    try:
        v = g.evaluate(
            from_source(cheat_source(path, g), None, "kernel.py"), exp.get("PROBLEM", RMS), agent=f"reach-{path.stem}"
        )

        # the workspace: the secret byte for byte, the database the same file with its earlier rows
        assert secret_file.exists(), f"{path.name}: secret.key was deleted"
        assert _sha(secret_file) == hashlib.sha256(secret_bytes).hexdigest(), f"{path.name}: secret.key changed"
        assert db_file.exists() and os.stat(db_file).st_ino == before_inode, (
            f"{path.name}: workspace.db was deleted or replaced"
        )
        after_rows = _rows(db_file)
        changed = sorted(k for k, row in before_rows.items() if after_rows.get(k) != row)
        assert not changed, f"{path.name}: earlier rows rewritten or removed: {changed[:5]}"

        # the secret: nowhere in what comes back to the agent or is stored of this verdict
        con = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)
        try:
            stored = " ".join(
                str(x)
                for row in con.execute(
                    "SELECT reason, diagnostic, verdict_json FROM candidates WHERE id = ?", (v.candidate_id,)
                )
                for x in row
            )
        finally:
            con.close()
        for text, where in ((v.model_dump_json(), "the verdict"), (stored, "the stored verdict")):
            for hex_, whose in ((secret_hex, "the workspace"), (other_hex, "another workspace")):
                leaked = hex_ in text or hex_[:16] in text  # a bool: pytest must not print the secret
                assert not leaked, f"{path.name}: {whose}'s secret is in {where}"
            assert HELDOUT_UUID not in text, f"{path.name}: an imported problem's held-out workload is in {where}"

        # and the cheat failed where it was blocked (an exception escaped)
        assert v.status == exp["runtime"], f"{path.name}: {v.status} {v.reason}\n{v.diagnostic}"
        assert v.decision == "REJECT"
    finally:
        if _sha(secret_file) != hashlib.sha256(secret_bytes).hexdigest():
            # put the secret back, so the next cheat is judged against the same workspace
            secret_file.unlink(missing_ok=True)
            fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secret_bytes)
