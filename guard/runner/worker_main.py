"""Entry point of a worker process: ``python -m guard.runner.worker_main --fd N --role R``.

The harness (captured references) is imported before anything else; the socket is the
only channel to the parent; stdout and stderr already go to a log file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .candidate_role import CandidateRole
    from .trusted_role import TrustedRole


def _limit_memory(gb: float) -> None:
    import resource

    limit = int(gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent(sock_fd: int) -> None:
    """A worker must not outlive the guard that started it (even a ``kill -9``): a daemon
    thread kills this process when the parent pid changes or the socket to the guard hangs
    up. In the sandbox the parent is the sandbox's init (PID 1 of its PID namespace), which
    never changes: there bwrap's --die-with-parent kills that init with the guard, and the
    kernel the whole namespace with it; the socket still tells, whichever way it runs."""
    import select
    import signal
    import threading

    parent = os.getppid()
    poller = select.poll()
    # POLLRDHUP: the peer closed; reported without consuming what the main thread reads
    poller.register(sock_fd, select.POLLRDHUP)

    def watch() -> None:
        while True:
            hung_up = any(
                ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL)
                for _, ev in poller.poll(500)
            )
            if hung_up or os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _keep_orphans() -> None:
    """Orphans of the candidate's processes become this worker's children instead of the
    machine's init's, so they stay in the tree the guard stops and accounts for while it
    measures (``freeze``). In the sandbox its own init keeps them anyway; without one this is
    what keeps a process that forks and exits from leaving the tree (the candidate's code,
    running in this process, could undo it: ``isolation: none`` is weaker, and says so)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """``argv``: the arguments, when a zygote forked this worker (``zygote_main``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--role", choices=["candidate", "trusted"], required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--memory-limit-gb", type=float)
    ap.add_argument("--spare", action="store_true", help="started ahead of its candidate (spare_setup)")
    ap.add_argument("--profile", action="store_true", help="profile each request (request_profile)")
    args = ap.parse_args(argv)
    _die_with_parent(args.fd)
    if args.role == "candidate":
        _keep_orphans()
        from ..sandbox.rlimits import limit_open_files

        limit_open_files()
    if args.memory_limit_gb:
        _limit_memory(args.memory_limit_gb)

    from . import harness  # noqa: F401  (captures before any candidate code exists)
    from . import protocol, spare_setup
    from .pacing import Pacer
    from .common import PeakMeter
    from .request_profile import RequestProfiler

    import torch

    sock = socket.socket(fileno=args.fd)
    device = args.device
    info = {"ready": True, "pid": os.getpid(), "torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        if device.startswith("cuda"):
            torch.cuda.init()
            device = "cuda:0" if device == "cuda" else device
            props = torch.cuda.get_device_properties(device)
            info.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(device)))
            try:
                info["gpu_uuid"] = "GPU-" + str(props.uuid)
            except AttributeError:
                pass
        # the version from the package's metadata: importing Triton cost every worker's start
        # 70-120 ms on the CPU, and a candidate that uses it imports it itself
        try:
            info["triton"] = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            info["triton"] = None
        if args.role == "candidate" and args.spare:
            info["setup_s"] = round(spare_setup.set_up(device), 3)
        workdir = Path.cwd()
        meter = PeakMeter(device)
        role: CandidateRole | TrustedRole
        if args.role == "candidate":
            from .candidate_role import CandidateRole

            role = CandidateRole(device, workdir, meter, Pacer(sock))
        else:
            from .trusted_role import TrustedRole

            role = TrustedRole(device, workdir, meter, Pacer(sock))
    except Exception as exc:
        protocol.send(sock, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        traceback.print_exc()
        return 1
    protocol.send(sock, info)
    profiler = RequestProfiler(cuda=device.startswith("cuda")) if args.profile else None
    while True:
        try:
            msg = protocol.recv(sock)
        except protocol.PeerGone:
            msg = {"op": "exit"}
        if msg.get("op") == "exit":
            if profiler is not None:
                profiler.write(workdir)
            return 0
        op = str(msg.get("op"))
        measured = op != "memory"
        if measured:
            meter.before()
        try:
            reply = profiler.handle(op, role.handle, msg) if profiler is not None else role.handle(msg)
        except BaseException as exc:  # noqa: BLE001 - report, then let the parent decide
            traceback.print_exc()
            reply = {"ok": False, "status": "INTERNAL", "message": f"{type(exc).__name__}: {exc}"[:2000]}
        if measured:
            meter.after(op)
        protocol.send(sock, reply)


if __name__ == "__main__":
    # as a forked worker ends: torch's interpreter teardown can outlast the guard's grace on a
    # loaded machine (killed at 2 s in CI), and nothing of a worker's is left to write by then
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
