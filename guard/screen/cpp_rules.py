"""Banned constructs in CUDA C++ candidates, found on the source with comments removed."""

from __future__ import annotations

import bisect
import re

from ..candidates.c_text import blanked
from .findings import Finding

RULES: list[tuple[str, str, str]] = [
    (
        r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|getStreamFromPool)\b",
        "stream",
        "new CUDA streams are not allowed: launch on at::cuda::getCurrentCUDAStream()",
    ),
    (r"\bstd::(thread|async|jthread)\b|\bpthread_create\b", "thread", "host threads are not allowed"),
    (r"\b(fork|vfork|popen|system|execv|execvp|execve|posix_spawn)\s*\(", "process", "other processes are not allowed"),
    (
        r"\b(fopen|freopen|open|openat|creat)\s*\(|\bstd::[io]?fstream\b|\b[io]fstream\b",
        "file",
        "reading or writing files is not allowed",
    ),
    (r"\b(getenv|secure_getenv|setenv|putenv)\s*\(|\benviron\b", "environment", "the environment is off limits"),
    (r"\b(dlopen|dlsym)\s*\(", "dynamic", "loading other libraries is not allowed"),
    (
        r"\b(cudaLaunchHostFunc|cuLaunchHostFunc|cudaStreamAddCallback|cuStreamAddCallback|"
        r"cudaGraphAddHostNode|cuGraphAddHostNode)\b",
        "host-callback",
        "host callbacks are not allowed: their time is not device work and escapes the timer",
    ),
    (r"\bcudaDeviceReset\s*\(|\bcudaSetDevice\s*\(", "device", "changing or resetting the device is not allowed"),
    (
        r"#\s*include\s*<(thread|future|fstream|filesystem)>",
        "include",
        "this header is for threads or files, which are not allowed",
    ),
    (r"\bKERNELARC_|secret\.key|workspace\.db|\.kernelarc\b", "workspace", "the workspace is off limits"),
]


def strip_comments(source: str) -> str:
    """Blank out comments and string literals, keeping line numbers (``c_text.blanked``: linear
    in the text, where a regular expression took quadratic time on an unclosed comment)."""
    return blanked(source)


def check(path: str, source: str) -> list[Finding]:
    code = strip_comments(source)
    # where lines end, found once (the same in both: blanking keeps newlines), not once per finding
    newlines = [m.start() for m in re.finditer("\n", source)]
    findings = []
    for pattern, rule, message in RULES:
        target = source if rule == "workspace" else code
        for m in re.finditer(pattern, target):
            line = bisect.bisect_left(newlines, m.start()) + 1
            findings.append(Finding(path, line, rule, f"{m.group(0).strip()}: {message}"))
    return findings
