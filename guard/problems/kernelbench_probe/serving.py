"""Probe requests on stdin, one JSON line each; every file probed in a forked child under a
memory and a time limit, so one file's memory, crash or global changes never reach the next."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time
import traceback
import warnings
from typing import Any

from .analyze import analyze
from .failures import ProbeFailure, memory_cap_gib


def _child(path: str, opts: dict[str, Any], wfd: int) -> None:
    os.dup2(2, 1)  # the file's own prints must not reach the protocol stream
    warnings.simplefilter("ignore")
    import torch

    # one thread: the runs are small, and OpenMP threads spinning on a busy machine made a
    # 0.1 s forward take seconds
    torch.set_num_threads(1)
    cap = int(memory_cap_gib() * (1 << 30))
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + cap, vm + cap))
    except (OSError, ValueError, StopIteration):
        pass
    try:
        reply: dict[str, Any] = {"ok": True, "spec": analyze(path, opts)}
    except ProbeFailure as f:
        reply = {"ok": False, "error": f"{f.phase}: {f.reason}" if f.phase != "probe" else f.reason}
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        reply = {
            "ok": False,
            "error": f"the probe failed: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}",
        }
    data = json.dumps(reply).encode()
    view = memoryview(data)
    while view:
        n = os.write(wfd, view)
        view = view[n:]
    os.close(wfd)
    os._exit(0)


def probe_in_child(path: str, opts: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Fork, probe ``path`` in the child, return its reply (or why it gave none)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        try:
            _child(path, opts, wfd)
        finally:
            os._exit(1)
    os.close(wfd)
    chunks: list[bytes] = []
    deadline, timed_out = time.monotonic() + timeout, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        poller = select.poll()  # not select.select: a server's descriptors may pass 1024
        poller.register(rfd, select.POLLIN)
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(rfd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return {"ok": False, "error": f"probing the file took over {timeout:g} s"}
    if chunks:
        reply: dict[str, Any] = json.loads(b"".join(chunks))
        return reply
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name
        why = " (killed: out of memory, or by another process)" if sig == signal.SIGKILL else ""
        return {"ok": False, "error": f"the probe process died of {name}{why} before it could say why"}
    return {"ok": False, "error": f"the probe process exited with status {os.WEXITSTATUS(status)} and no reply"}


def warm_up(torch: Any) -> None:
    """Load torch's lazily imported meta machinery once, before forking (meta only: no CPU
    kernel runs here, so no thread pool exists when the children fork)."""
    with torch.device("meta"), torch.no_grad():
        x = torch.randn(2, 3, 8, 8)
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.LazyLinear(5),
        )
        m(x).softmax(-1)
        torch.nn.LSTM(4, 4, batch_first=True)(torch.randn(2, 3, 4))


def serve() -> None:
    import torch  # noqa: F401 - imported once, before the children fork

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            warm_up(torch)
        except Exception:  # noqa: BLE001 - only a speed-up
            pass
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        t0 = time.perf_counter()
        reply = probe_in_child(req["path"], req.get("options") or {}, float(req.get("timeout", 120)))
        reply["seconds"] = time.perf_counter() - t0
        out.write(json.dumps(reply) + "\n")
        out.flush()
