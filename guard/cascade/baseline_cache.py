"""Reference baselines shared by every workspace of this user on this machine.

A baseline is the reference's own time (eager and compiled) on one workload of one device.
Each workspace's database keeps the ones it used; this folder (``<cache>/baselines``) lets a
new workspace (a demo started afresh, a second project on the same problem, a test) skip
measuring what another already measured with the same settings.

One key (``baseline_key``) names a baseline wherever it is kept, the file here and the row of
a workspace's database: the definition's content hash, the workload's whole content (axes,
input specs, tolerance, not its uuid alone: two problem folders may reuse uuids, and a
workload edited in place keeps its own), the size and modification time of every file it
loads inputs from, the device, the settings that shape the measurement, and the versions of
Python, torch and Triton. A row or file whose key differs is a miss and is measured again.
A file that cannot be read or does not hold a baseline is a miss, never an error. A device
the guard cannot name (``cuda-unknown``) shares nothing through this folder.

Trust: candidate workers never see the cache folder (it is not bound into their sandbox). A
process of the same user outside the sandbox (an agent's own shell) can rewrite it, as it
can the workspace itself; a baseline feeds the reported speedups and SOL scores
(``scoring_gate``), never an ACCEPT or REVERT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from ..paths import cache_dir

log = logging.getLogger(__name__)

# raised when what a baseline holds, or how it is measured, changes: older entries become misses
FORMAT = 3  # 3: a CPU call's time is the lesser of its wall and its CPU time (session 33)


def baselines_dir() -> Path:
    return cache_dir() / "baselines"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@cache
def software() -> dict[str, str | None]:
    """What a measurement ran on besides the device: an upgrade times the reference anew.
    Read once per process: the package metadata is searched on disk, and a problem asks it
    for every workload."""
    return {"python": platform.python_version(), "torch": _version("torch"), "triton": _version("triton")}


def input_files(root: Path | None, workload: dict[str, Any]) -> dict[str, list[int] | None]:
    """Size and modification time (ns) of each file the workload loads inputs from, by path;
    None for a file that is not there (the inputs are then drawn at random)."""
    out: dict[str, list[int] | None] = {}
    for spec in (workload.get("inputs") or {}).values():
        if not isinstance(spec, dict) or spec.get("type") != "safetensors" or not spec.get("path"):
            continue
        path = str(spec["path"])
        try:
            st = (root / path).stat() if root is not None else None
            out[path] = [st.st_size, st.st_mtime_ns] if st is not None else None
        except OSError:
            out[path] = None
    return out


def baseline_key(
    definition_hash: str,
    workload: dict[str, Any],
    files: dict[str, list[int] | None],
    device_key: str,
    settings: dict[str, Any],
) -> str:
    """The one name of a baseline (``workload``: the workload as JSON, ``files``:
    ``input_files``), in the cache folder and in a workspace's database alike."""
    blob = json.dumps([FORMAT, definition_hash, workload, files, device_key, settings, software()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def matches(entry: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """``entry`` when it is a baseline stored under ``key``, else None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("eager"), dict) or entry.get("key") != key:
        return None
    return entry


def _path(key: str) -> Path:
    return baselines_dir() / f"{key[:32]}.json"


def load(key: str) -> dict[str, Any] | None:
    """The cached baseline of ``key``, or None."""
    path = _path(key)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    found = matches(data, key)
    if found is None:
        log.warning("ignoring a baseline cache file that holds no baseline of its key: %s", path)
    return found


def store(key: str, result: dict[str, Any]) -> None:
    """Write the baseline with its key (whole or not at all: a temporary file renamed into place)."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({**result, "key": key}, f)
        os.replace(tmp, path)
    except OSError as exc:  # a cache: the workspace's database still has it
        log.warning("could not write the baseline cache (%s): %s", path.parent, exc)
