"""Entry point of a zygote: ``python -m guard.runner.zygote_main --fd N [--cells ROOT]``.

It imports torch and a worker's modules once, then forks a worker for each request on its
socket (``zygote.Zygote``): the child starts from that state, in a few milliseconds instead of
the second or more an import of torch takes. It never runs candidate code, never initialises a
GPU (a forked child must make its own CUDA context) and starts no thread, so that a fork
copies a consistent process.

Two kinds:
- trusted workers' (no ``--cells``): unconfined, as trusted workers are; a fork is the worker.
- candidate workers' (``--cells ROOT``): inside the OS sandbox, with the capabilities to
  mount. A fork makes new namespaces and forks again: that grandchild, PID 1 of its own PID
  namespace, enters its cell (``guard.sandbox.cell``: its own folder in ROOT, its own /proc,
  /tmp and network, no capability) and becomes the worker; the child between them waits for
  it and exits as it did.

Its requests and replies are ``zygote_messages``'s models, validated at both ends.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import sys
import traceback
from pathlib import Path
from collections.abc import Callable
from typing import Any

from . import zygote_messages as zm
from .fds import close_quietly

MAX_REQUEST = 1 << 20
SIGNALLED = 128  # a cell's child exits with this plus the signal that killed its worker
PR_SET_DUMPABLE = 4


def _child(request: zm.Fork, worker_fd: int, log_fd: int, control: socket.socket | None) -> None:
    """In the forked child: become the worker ``worker_main`` would have been after its
    imports. Never returns."""
    code = 1
    try:
        if control is not None:
            control.close()
        _close_all_but(worker_fd, log_fd)
        os.setsid()  # its own session: a kill of its group takes its children too
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.chdir(request.cwd)
        sys.path[0] = request.cwd  # as ``python -m`` in the worker's folder has it
        os.environ.clear()
        os.environ.update(request.env)
        from . import worker_main

        code = worker_main.main([*request.argv, "--fd", str(worker_fd)])
    except BaseException:  # noqa: BLE001 - the log says why; the guard sees the exit
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _cell_child(
    cell_dir: Path, cells: Path, report: int, err_fd: int, become: Callable[[], None], drop: list[int]
) -> None:
    """In a forked child of a candidates' zygote: new namespaces, then a fork that is PID 1 of
    the new PID namespace, enters its cell ``cell_dir`` and calls ``become`` (the worker, or the
    zygote's trial's exit), its pid written to ``report``; this child waits for it and ends as it
    did (the zygote reaps it). ``err_fd``: where a cell that cannot be made says why; ``drop``:
    descriptors only the cell keeps. Never returns."""
    code = 1
    try:
        os.setsid()  # a kill of this group takes the cell too
        from ..sandbox import cell

        cell.unshare_for_cell()
        pid = os.fork()
        if pid == 0:
            os.close(report)
            try:
                cell.enter_cell(cell_dir, cells)
            except BaseException:  # noqa: BLE001 - nothing may run outside its cell
                os.dup2(err_fd, 2)
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            become()
            os._exit(1)
        for fd in drop:
            os.close(fd)
        os.write(report, str(pid).encode())
        os.close(report)
        # nothing of this process (a copy of the zygote's, torch and all) may land in a core
        # file: it ends as the worker did by its exit status alone (red team, session 32)
        os.chdir("/")
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _, status = os.waitpid(pid, 0)
        code = SIGNALLED + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    except BaseException:  # noqa: BLE001 - the zygote's log says why; the guard sees the exit
        traceback.print_exc()
    finally:
        os._exit(code)


def _returncode(status: int, cell: bool = False) -> int:
    """As ``subprocess`` gives it: negative for a signal. A cell's child says its worker's
    signal as ``SIGNALLED`` plus its number."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    code = os.WEXITSTATUS(status)
    return -(code - SIGNALLED) if cell and code > SIGNALLED else code


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _close_all_but(*keep: int) -> None:
    """Nothing of the zygote's stays open in a worker but what it is given."""
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _fork(request: zm.Fork, fds: list[int], control: socket.socket, cells: Path | None) -> tuple[zm.Forked, list[int]]:
    """Fork the worker asked for; the reply and the pidfds to send with it. Raises OSError
    where no process can be had (the descriptors it was given closed, no child left)."""
    worker_fd, log_fd = fds
    sys.stdout.flush()
    sys.stderr.flush()
    report_r = report_w = -1
    try:
        if cells is not None:
            report_r, report_w = os.pipe()
        pid = os.fork()
    except OSError:
        for fd in (worker_fd, log_fd, report_r, report_w):
            if fd >= 0:
                os.close(fd)
        raise
    if pid == 0:
        if cells is None:
            _child(request, worker_fd, log_fd, control)
        else:
            os.close(report_r)
            control.close()
            _cell_child(
                Path(request.cwd),
                cells,
                report_w,
                log_fd,
                lambda: _child(request, worker_fd, log_fd, None),
                [worker_fd, log_fd],
            )
    os.close(worker_fd)
    os.close(log_fd)
    try:
        pidfds = [os.pidfd_open(pid)]
    except OSError:  # a child that cannot be watched must not live
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        raise
    if cells is None:
        return zm.Forked(pid=pid), pidfds
    os.close(report_w)
    try:
        said = os.read(report_r, 64)
    finally:
        os.close(report_r)
    if not said:  # it failed before the worker was forked; its exit status says so
        return zm.Forked(pid=pid), pidfds
    try:
        pidfds.append(os.pidfd_open(int(said)))
    except OSError:  # the worker is gone already (its cell failed): its child's status says how
        return zm.Forked(pid=pid), pidfds
    return zm.Forked(pid=pid, cell=True), pidfds


def _answer(
    request: zm.Fork | zm.Reap, fds: list[int], control: socket.socket, cells: Path | None
) -> tuple[zm.Forked | zm.Reaped | zm.Failed, list[int]]:
    """The reply to a valid request and the descriptors to send with it."""
    if isinstance(request, zm.Fork):
        if len(fds) != 2:
            close_quietly(*fds)
            return zm.Failed(error=f"fork: {len(fds)} descriptors came with it, not 2"), []
        try:
            return _fork(request, fds, control, cells)
        except OSError as exc:  # no process to be had now: this worker, not the zygote, fails
            return zm.Failed(error=f"fork: {exc}"), []
    close_quietly(*fds)
    try:
        _, status = os.waitpid(request.pid, 0)
    except ChildProcessError:
        return zm.Reaped(returncode=None), []
    return zm.Reaped(returncode=_returncode(status, cell=cells is not None)), []


def serve(control: socket.socket, cells: Path | None = None) -> int:
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 2)
        except OSError:
            return 0
        if not data:  # the guard is gone: its workers notice through their own sockets
            return 0
        sent: list[int] = []
        reply: zm.Forked | zm.Reaped | zm.Failed
        try:
            request = zm.REQUEST.validate_json(data)
        except zm.ValidationError as exc:  # out of protocol: said so, and it serves on
            close_quietly(*fds)
            reply = zm.Failed(error=f"not a request: {exc.errors()[0]['msg']}")
        else:
            reply, sent = _answer(request, fds, control, cells)
        socket.send_fds(control, [zm.encode(reply)], sent)
        for fd in sent:
            os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--cells", type=Path, help="fork candidate workers, each into its own folder of this one")
    args = ap.parse_args()
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=args.fd)
    # no core file of the zygote or of what it forks (each a copy of torch and all), anywhere
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # what a worker imports before it says ready: the harness first, as there
    from . import harness  # noqa: F401
    from . import common, protocol  # noqa: F401

    if args.cells is not None:
        from ..sandbox import cell  # noqa: F401
        from . import candidate_role  # noqa: F401
    else:
        from . import trusted_role  # noqa: F401

    import torch  # noqa: F401

    if args.cells is not None:
        why = _try_a_cell(args.cells)
        if why is not None:  # the guard starts its candidate workers another way
            control.send(zm.encode(zm.Started(ready=False, error=why)))
            return 1
    control.send(zm.encode(zm.Started(ready=True)))
    return serve(control, args.cells)


def _try_a_cell(cells: Path) -> str | None:
    """Enter a cell once, the way a worker does, before saying ready: where this kernel or
    container will not make one, no candidate's worker may be the first to find out. None if
    it worked, else why not."""
    probe = cells / f".probe-{os.getpid()}"
    probe.mkdir()
    said_r, said_w = os.pipe()
    report_r, report_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(said_r)
            os.close(report_r)
            _cell_child(probe, cells, report_w, said_w, lambda: os._exit(0), [said_w])
        os.close(said_w)
        os.close(report_w)
        said = b""
        while chunk := os.read(said_r, 4096):  # until the cell's end closes the last writer
            said += chunk
        _, status = os.waitpid(pid, 0)
        if status == 0:
            return None
        lines = said.decode(errors="replace").strip().splitlines()
        return "a cell could not be made here: " + (lines[-1] if lines else f"wait status {status}")
    finally:
        os.close(said_r)
        os.close(report_r)
        probe.rmdir()


if __name__ == "__main__":
    sys.exit(main())
