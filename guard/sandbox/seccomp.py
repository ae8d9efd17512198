"""A seccomp filter for candidate workers: the few system calls whose kernel objects no
namespace separates, refused.

- ``add_key``, ``request_key``, ``keyctl``: keyrings and their quotas belong to a uid, not to a
  mount or PID namespace. Cells of one sandbox share them: a key one cell stored was read by
  the next cell after the first was killed, and one cell used up the host root's key quota
  (red team, session 32).
- a user namespace of the candidate's own (``unshare`` or ``clone`` with ``CLONE_NEWUSER``;
  ``clone3``, whose flags a filter cannot read, answers ENOSYS so that the C library falls back
  to ``clone``): it gives back every capability over new namespaces, a large kernel surface
  that no honest kernel needs.
- ``ptrace``, ``process_vm_readv``, ``process_vm_writev``: a sandbox's processes share its PID
  namespace with its init (bwrap's), which waits for them; a candidate that stopped that init
  under ``ptrace`` and then ended kept its caller waiting for good (red team of ``kernelarc
  verify``'s sandbox, session 43). No kernel needs to trace or write another process.
- ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: a second way into the kernel's
  system calls, whose operations this filter would not see; no kernel of ours needs it.
- ``socket`` of the ``AF_VSOCK`` family: a channel to the hypervisor and other VMs that no
  network namespace separates (a sandbox has no network of its own; session 43's red team
  could make one, on a GPU machine that is a VM).
- system calls of another ABI than the native one (x86's 32-bit ``int 0x80``, x32), which
  would go around the numbers above.

Everything else is allowed. The program is classic BPF, built here (no libseccomp): the same
bytes go to bwrap's ``--seccomp`` for a worker with a sandbox of its own, and to
``install()`` in a cell (``guard.sandbox.cell``). ``program()`` raises ``UnknownArchitecture``
where the machine is neither x86-64 nor arm64.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct

# classic BPF
_LD_W_ABS = 0x20
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45
_RET_K = 0x06
# seccomp
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian)
CLONE_NEWUSER = 0x10000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_X32_BIT = 0x40000000

log = logging.getLogger(__name__)


class UnknownArchitecture(RuntimeError):
    pass


# audit architecture, system call numbers: add_key, request_key, keyctl, unshare, clone, clone3,
# socket; then those refused outright besides the keyrings' (ptrace, process_vm_readv,
# process_vm_writev, io_uring_setup, io_uring_enter, io_uring_register)
_ARCHES = {
    "x86_64": (0xC000003E, (248, 249, 250, 272, 56, 435, 41), (101, 310, 311, 425, 426, 427)),
    "aarch64": (0xC00000B7, (217, 218, 219, 97, 220, 435, 198), (117, 270, 271, 425, 426, 427)),
}
AF_VSOCK = 40


def program(machine: str | None = None) -> bytes:
    """The filter as an array of ``struct sock_filter``."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise UnknownArchitecture(f"no seccomp filter for {machine}")
    arch, (add_key, request_key, keyctl, unshare, clone, clone3, socket), refused = _ARCHES[machine]
    # (code, k, where to go if true, if false): a label, or None for the next instruction
    ops: list[tuple[str | None, int, int, str | None, str | None]] = [
        (None, _LD_W_ABS, _ARCH, None, None),
        (None, _JEQ_K, arch, None, "nosys"),  # another ABI: refused
        (None, _LD_W_ABS, _NR, None, None),
    ]
    if machine == "x86_64":
        ops.append((None, _JGE_K, _X32_BIT, "deny", None))
    ops += [
        (None, _JEQ_K, add_key, "deny", None),
        (None, _JEQ_K, request_key, "deny", None),
        (None, _JEQ_K, keyctl, "deny", None),
        *((None, _JEQ_K, nr, "deny", None) for nr in refused),
        (None, _JEQ_K, clone3, "nosys", None),
        (None, _JEQ_K, socket, "domain", None),
        (None, _JEQ_K, unshare, "flags", None),
        (None, _JEQ_K, clone, "flags", "allow"),
        ("flags", _LD_W_ABS, _ARG0_LOW, None, None),
        (None, _JSET_K, CLONE_NEWUSER, "deny", "allow"),
        ("domain", _LD_W_ABS, _ARG0_LOW, None, None),
        (None, _JEQ_K, AF_VSOCK, "deny", "allow"),
        ("allow", _RET_K, _RET_ALLOW, None, None),
        ("deny", _RET_K, _RET_ERRNO | errno.EPERM, None, None),
        ("nosys", _RET_K, _RET_ERRNO | errno.ENOSYS, None, None),
    ]
    at = {label: i for i, (label, *_) in enumerate(ops) if label}

    def skip(i: int, to: str | None) -> int:
        return 0 if to is None else at[to] - i - 1

    return b"".join(
        struct.pack("<HBBI", code, skip(i, yes), skip(i, no), k) for i, (_, code, k, yes, no) in enumerate(ops)
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Apply the filter to this process and what it starts (``no_new_privs`` must be set)."""
    code = program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {os.strerror(err)}")


def pipe() -> int | None:
    """A pipe's read end holding the filter, for bwrap's ``--seccomp`` (the caller closes it
    once bwrap has started); None, and a warning, where this machine has no filter."""
    try:
        code = program()
    except UnknownArchitecture as exc:
        log.warning("candidate workers run without a seccomp filter: %s", exc)
        return None
    read, write = os.pipe()
    try:
        os.write(write, code)  # a few hundred bytes: within a pipe's buffer
    finally:
        os.close(write)
    return read
