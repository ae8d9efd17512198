"""``kernelarc verify`` runs the kernels it plugs in inside the guard's sandbox: a kernel
cannot read the workspace it came from, write outside its scratch folder or leave anything
behind, and what it reports back is checked before it is believed."""

from __future__ import annotations

import json
import os

import pytest

from guard.workspace import Workspace
from wholemodel.loader import load
from wholemodel.problems import write_problems
from wholemodel.profile import profile_model
from wholemodel.verify import Verification

from helpers import DATA, fast_workspace, kernelarc

PROBLEM = "llama_block_small_rmsnorm"

# An RMSNorm that works, and at import looks for what it must not reach: the workspace's
# secret and database, the user's home, and a file to write beside the workspace.
PROBING_KERNEL = """
import os, sys, torch

reached = []
for path in {targets!r}:
    try:
        with open(path, "rb") as f:
            f.read(1)
        reached.append("read " + path)
    except OSError:
        pass
try:  # what it writes where /tmp is its own is lost with it: the host's file is what counts
    with open({outside!r}, "w") as f:
        f.write("escaped")
except OSError:
    pass
print("PROBE " + ";".join(reached), file=sys.stderr)


def run(hidden_states, weight):
    x = hidden_states.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * weight.float()
    return y.to(hidden_states.dtype)
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace holding the small Llama block's RMSNorm problem, with its secret made."""
    root = tmp_path_factory.mktemp("verify-sandbox")
    ws = Workspace.open(fast_workspace(root / "ws"))
    folders, _ = write_problems(profile_model(load("llama_block", device="cpu"), reps=1, warmup=1), 10, root / "p")
    (folder,) = [f for f in folders if f.name == PROBLEM]
    ws.problems().import_path(folder)
    assert len(ws.secret) == 32  # made on first use
    return ws


def _probe_file(ws: Workspace, tmp_path) -> tuple:
    outside = tmp_path / "outside.txt"
    targets = [str(ws.secret_path), str(ws.db_path), str(ws.config_path), os.path.expanduser("~/.bashrc")]
    targets = [t for t in targets if os.path.exists(t)]
    kernel = tmp_path / "rmsnorm_probe.py"
    kernel.write_text(PROBING_KERNEL.format(targets=targets, outside=str(outside)))
    return kernel, outside


def _state(ws: Workspace) -> dict:
    return {p: p.read_bytes() for p in (ws.secret_path, ws.db_path) if p.exists()}


def _verify(ws: Workspace, kernel, *extra):
    return kernelarc(
        ws.root,
        "verify",
        "llama_block",
        "--device",
        "cpu",
        "--kernel",
        f"{PROBLEM}={kernel}",
        "--reps",
        "1",
        "--json",
        *extra,
    )


@pytest.mark.slow
def test_a_plugged_kernel_reaches_nothing_of_the_workspace(workspace, tmp_path, needs_bwrap, monkeypatch):
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    kernel, outside = _probe_file(workspace, tmp_path)
    before = _state(workspace)
    proc = _verify(workspace, kernel)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["ran"].startswith("in the sandbox (isolation: bubblewrap")
    assert doc["total"]["use"][PROBLEM]["served"] == 2
    probes = [line for line in proc.stderr.splitlines() if line.startswith("PROBE")]
    assert probes == ["PROBE "], proc.stderr  # it ran, and reached nothing
    assert not outside.exists()
    assert _state(workspace) == before
    assert list((tmp_path / "cache" / "verify").iterdir()) == []  # its scratch folder is gone
    # the same kernel in this process reaches it all: the probe is able to see what it looks for
    proc = _verify(workspace, kernel, "--in-process")
    probes = [line for line in proc.stderr.splitlines() if line.startswith("PROBE")]
    assert len(probes) == 1 and f"read {workspace.secret_path}" in probes[0]
    assert outside.read_text() == "escaped"


@pytest.mark.slow
def test_a_model_file_runs_in_the_sandbox_from_its_own_folder(tmp_path, needs_bwrap, monkeypatch):
    """The model's file is loaded again inside, where its folder is shown read-only and the
    folder the user ran verify from is not; it gives what the same job gives in this process."""
    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    model = str((DATA / "wholemodel" / "custom_model.py").relative_to(DATA.parent.parent))  # from the repo root
    args = ["verify", model, "--device", "cpu", "--dtype", "bfloat16", "--seeds", "--reps", "1", "--json"]
    inside, here = (
        json.loads(kernelarc(tmp_path / "ws", *args, *extra).stdout.strip().splitlines()[-1])
        for extra in ([], ["--in-process"])
    )
    assert inside["ran"].startswith("in the sandbox") and here["ran"].startswith("in this process")
    assert inside["ok"] and inside["model"] == "custom_model"
    served = {n: u["served"] for n, u in inside["total"]["use"].items()}
    assert served == {"custom_model_rmsnorm": 1, "custom_model_matmul": 1}
    assert served == {n: u["served"] for n, u in here["total"]["use"].items()}
    assert inside["total"]["check"] == here["total"]["check"]  # the same kernels, the same numbers


def _verification() -> Verification:
    from wholemodel.accuracy import Check, Errors
    from wholemodel.verify import KernelUse, Trial

    use = {"k": KernelUse(3, 1, [0.5, 0.25], [0.125])}
    check = Check(False, Errors(float("inf"), 2.0, 4), Errors(0.01, 0.5, 0), 0.02, 1.0, "4 NaN/Inf elements")
    trial = Trial(["k"], check, 2.0, 1.0, use)
    return Verification("m", "cpu", "bfloat16", 2.0, 3, trial, [trial], {"k": "file k.py"})


def test_a_verification_crosses_as_json_unchanged():
    v = _verification()
    assert Verification.from_json(json.loads(json.dumps(v.to_json()))) == v


@pytest.mark.parametrize("kind", ["link", "huge", "not_json", "malformed"])
def test_a_result_the_sandbox_left_is_checked_before_it_is_believed(tmp_path, kind):
    """The result file lies in the folder the kernels wrote: a link to a file of the user's is
    not followed, and what is not a verification is an error, never a figure."""
    from wholemodel import sandboxed

    result = tmp_path / sandboxed.RESULT_FILE
    private = tmp_path / "private.json"
    private.write_text(json.dumps(_verification().to_json()))
    if kind == "link":
        result.symlink_to(private)
    elif kind == "huge":
        result.write_bytes(b" " * (sandboxed.MAX_RESULT_BYTES + 1))
    elif kind == "not_json":
        result.write_text("{")
    else:
        result.write_text(json.dumps({"model": "m"}))
    with pytest.raises(sandboxed.SandboxedVerifyFailed):
        sandboxed.parse_result(result)
