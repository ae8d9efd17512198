"""Banned constructs in CUDA C++ candidates, found on the source with comments removed."""

from __future__ import annotations

import re

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
    """Blank out comments and string literals, keeping line numbers."""

    def blank(m: re.Match[str]) -> str:
        text = m.group(0)
        if text.startswith('"'):
            return '"' + re.sub(r"[^\n]", " ", text[1:-1]) + '"'
        return re.sub(r"[^\n]", " ", text)

    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, source, flags=re.S)


def check(path: str, source: str) -> list[Finding]:
    code = strip_comments(source)
    findings = []
    for pattern, rule, message in RULES:
        target = source if rule == "workspace" else code
        for m in re.finditer(pattern, target):
            line = target.count("\n", 0, m.start()) + 1
            findings.append(Finding(path, line, rule, f"{m.group(0).strip()}: {message}"))
    return findings
