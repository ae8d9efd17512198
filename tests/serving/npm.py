"""Real MCP clients from the npm registry, installed on first use into a per-user cache."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("KERNELARC_TEST_NPM") or Path.home() / ".cache" / "kernelarc-tests" / "npm")
INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CODEX = "@openai/codex@0.171.0"


def npm_bin(spec: str, binary: str) -> Path:
    """Path of ``binary`` from package ``spec``, installing it if needed. Skips only when
    this machine has no npm at all; a failed install fails the test. Test processes running
    side by side (pytest-xdist) install one at a time: a half-installed package (its command
    linked, a dependency not yet unpacked) once failed a test that found the command there."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed on this machine")
    folder = CACHE / re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    exe = folder / "node_modules" / ".bin" / binary
    done = folder / ".installed"  # written once the install has finished
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done.exists() and exe.exists()):
            shutil.rmtree(folder, ignore_errors=True)  # whatever an interrupted install left
            folder.mkdir(parents=True)
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(folder), spec],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert proc.returncode == 0 and exe.exists(), f"npm install {spec} failed:\n{proc.stderr[-2000:]}"
            done.write_text(spec)
    return exe
