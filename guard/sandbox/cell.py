"""A cell: one candidate worker's own corner of a shared sandbox, entered by a process forked
from the candidates' zygote (``guard.runner.zygote_main``), before any candidate code runs.

bwrap makes the sandbox (``bwrap.wrap``): the host's files hidden or read-only, no workspace,
no network. The zygote inside it has imported torch once, and keeps two capabilities there
(CAP_SYS_ADMIN to mount, CAP_SETPCAP to drop the rest) over that sandbox's own namespaces
only. A forked worker then makes the part that must not be shared with the workers forked
before or after it:

- ``unshare_for_cell``, in the forked child: new mount, PID, network, IPC and UTS namespaces.
  The caller forks once more: the grandchild is PID 1 of the new PID namespace, so killing it
  kills every process the candidate made, whatever session it chose.
- ``enter_cell``, in that grandchild: everything mounted private; its own ``/tmp`` and
  ``/dev/shm`` (with what the sandbox bound inside them bound again, as it was); the folder that holds every worker's folder covered by an empty read-only
  tmpfs (or gone with the old ``/tmp`` or ``/dev/shm`` it lay in), with only this worker's
  folder bound back, writable; its own ``/dev/pts``; a ``/proc`` of its own PID namespace
  (other workers and the zygote out of sight); then every capability dropped, the bounding
  set emptied (an ``execve`` as root gets nothing back), ``no_new_privs`` set, and the
  seccomp filter of ``guard.sandbox.seccomp`` applied (keyrings, which no namespace
  separates, and user namespaces of its own refused). What it
  mounted can no longer be undone: without capabilities it may not unmount, and a user
  namespace of its own sees these mounts locked.

Any step that fails raises ``CellError``: the worker must then not run.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from . import seccomp
from .policy import PROC_READ_ONLY, TMPFS_BYTES

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CELL_NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class CellError(OSError):
    pass


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise CellError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str | Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if x is None else str(x).encode() for x in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


SHARED_TMP = (Path("/tmp"), Path("/dev/shm"))


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _bound_in_shared_tmp(cells_root: Path) -> list[tuple[Path, bool]]:
    """The outermost mounts strictly inside /tmp or /dev/shm, but the pool's folder (and what
    lies in it), with whether each is read-only: (path, read_only), outer first."""
    found: list[tuple[Path, bool]] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")[0].split()
        point = Path(_unescape(fields[4]))
        inside = any(tmp in point.parents for tmp in SHARED_TMP)
        ours = point == cells_root or cells_root in point.parents
        if inside and not ours and not any(p == point or p in point.parents for p, _ in found):
            found.append((point, "ro" in fields[5].split(",")))
    return found


def unshare_for_cell() -> None:
    """New namespaces for the next child, which becomes PID 1 of its own PID namespace. The
    caller must be single-threaded (a zygote starts no thread)."""
    _check(_libc.unshare(CELL_NAMESPACES), "unshare")


def enter_cell(cell: Path, cells_root: Path) -> None:
    """Mount this worker's view and drop every capability (see the module's docstring).
    ``cell``: its own folder, directly inside ``cells_root``."""
    cell, cells_root = Path(cell), Path(cells_root)
    if cell.parent != cells_root:
        raise CellError(0, f"{cell} is not a folder of {cells_root}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the zygote
    # What lies in the shared /tmp and /dev/shm, which are replaced next, is held by
    # descriptors: its own folder (a pool's folder is often in /dev/shm), and what the sandbox
    # bound there read-only (a project, a venv or a workspace's problem folders under /tmp).
    fd = os.open(cell, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    held = [(point, os.open(point, os.O_PATH), read_only) for point, read_only in _bound_in_shared_tmp(cells_root)]
    try:
        for tmp in SHARED_TMP:
            _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={TMPFS_BYTES}")
        for point, point_fd, read_only in held:  # back, at the same paths, as they were
            if os.path.isdir(f"/proc/self/fd/{point_fd}"):
                point.mkdir(parents=True, exist_ok=True)
            else:
                point.parent.mkdir(parents=True, exist_ok=True)
                point.touch()
            _mount(f"/proc/self/fd/{point_fd}", point, None, MS_BIND | MS_REC)
            if read_only:
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        covered = cells_root.is_dir()  # still there: every worker's folder is hidden under a tmpfs
        if covered:
            _mount("tmpfs", cells_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
        else:  # gone with the old /tmp or /dev/shm: only the path is made again
            cells_root.mkdir(parents=True)
        cell.mkdir()
        _mount(f"/proc/self/fd/{fd}", cell, None, MS_BIND | MS_REC)
    finally:
        os.close(fd)
        for _, point_fd, _ in held:
            os.close(point_fd)
    if covered:
        _mount(None, cells_root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    # its own pseudo-terminals: bwrap's devpts is one for the whole sandbox, where a cell
    # read what another wrote to a terminal it opened (red team, session 32)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    # a /proc of its own PID namespace, with the same entries read-only as bwrap's
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READ_ONLY:
        path = Path("/proc") / name
        if path.exists():
            _mount(str(path), path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    drop_capabilities()
    try:  # keyrings are shared by every cell of the sandbox: refused, as a user namespace is
        seccomp.install()
    except (OSError, seccomp.UnknownArchitecture) as exc:
        raise CellError(0, f"seccomp: {exc}") from None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Every capability gone, for good: the bounding set emptied (so that an ``execve`` as
    root gains none), the ambient set cleared, the effective, permitted and inheritable sets
    zeroed, and ``no_new_privs`` (no setuid or file capability gains either). Checked after."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap} from the bounding set")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    left = {
        k: int(v, 16)
        for k, v in (
            line.split(":") for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("Cap")
        )
    }
    if any(left.values()):
        raise CellError(0, f"capabilities left after dropping them: {left}")
