"""OS sandbox around candidate workers (bubblewrap): no view of the workspace, the secret,
other processes or the network; writes only in the worker's own folder.

- ``SandboxPolicy.for_worker(workdir, device, protect=..., readonly=..., expose=..., env=...)``
- ``wrap(policy, argv, env, info_fd=None)``: the bwrap command line
- ``probe()`` / ``ensure_isolation()`` / ``isolation_line()``: what this machine allows
- ``launch.prepare(policy, argv, env, ...)``: that command with its seccomp filter, the
  descriptors it inherits and its cgroups, released together when its start fails
- ``cgroups.SandboxGroup.make(limit)``: a sandbox's cgroups: its tasks capped, its CPU time counted
"""

from __future__ import annotations

from . import cgroups, launch, seccomp
from .bwrap import bwrap_binary, wrap
from .policy import SandboxPolicy, scratch_env
from .isolation import Isolation, SandboxUnavailable, ensure_isolation, isolation_line, probe

__all__ = [
    "Isolation",
    "SandboxPolicy",
    "SandboxUnavailable",
    "bwrap_binary",
    "ensure_isolation",
    "isolation_line",
    "cgroups",
    "launch",
    "probe",
    "scratch_env",
    "seccomp",
    "wrap",
]
