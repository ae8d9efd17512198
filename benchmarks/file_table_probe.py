"""How many of the host's open files a process holds past its RLIMIT_NOFILE, through mappings.

    python benchmarks/file_table_probe.py [FILES] [--memory-mb MB]

Sets its own limit to a candidate's (``guard.sandbox.rlimits.CANDIDATE_OPEN_FILES``), then
opens one memfd FILES times through /proc/self/fd (each open makes a new file of the host's
table), maps each with the C library's ``mmap`` and closes the descriptor: the mapping keeps
the file. Prints the limit, the descriptors left open and how much the host's table
(/proc/sys/fs/file-nr) grew. ``--memory-mb``: run that in a memory cgroup capped at MB, as a
sandbox's (``guard.sandbox.cgroups``), and say how it ended. It shows what the limit does not bound (docs/guard.md, "The
host's file table"); it holds what it made until it exits.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

from guard.sandbox.rlimits import limit_open_files

PROT_READ, MAP_SHARED = 1, 1


def files_in_table() -> int:
    with open("/proc/sys/fs/file-nr") as f:
        return int(f.read().split()[0])


def in_memory_group(count: int, megabytes: int) -> int:
    import subprocess

    from guard.sandbox import cgroups

    group = cgroups.SandboxGroup.make(64, "file-table-probe", megabytes << 20)
    if group is None or group.memory_path is None:
        print("no memory cgroup can be made here")
        return 1
    try:
        proc = subprocess.run(group.enter([sys.executable, __file__, str(count)]), capture_output=True, text=True)
        lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        said = lines[-1] if lines else ""
        print(f"under a {megabytes} MB memory cap: exit {proc.returncode}, OOM kills {group.oom_kills()}: {said}")
    finally:
        group.close()
    return 0


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else 5000
    if "--memory-mb" in sys.argv:
        return in_memory_group(count, int(sys.argv[sys.argv.index("--memory-mb") + 1]))
    limit_open_files()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    before = files_in_table()
    memfd = os.memfd_create("probe")
    os.ftruncate(memfd, 4096)
    failed = ctypes.c_void_p(-1).value
    for _ in range(count):
        fd = os.open(f"/proc/self/fd/{memfd}", os.O_RDWR)
        if libc.mmap(None, 4096, PROT_READ, MAP_SHARED, fd, 0) in (None, failed):
            raise OSError(ctypes.get_errno(), "mmap failed")
        os.close(fd)
    print(
        f"RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)}; descriptors open "
        f"{len(os.listdir('/proc/self/fd'))}; the host's file table grew by {files_in_table() - before} "
        f"for {count} mapped files"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
