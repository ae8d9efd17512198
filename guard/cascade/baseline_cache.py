"""Reference baselines shared by every workspace of this user on this machine.

A baseline is the reference's own time (eager and compiled) on one workload of one device.
Each workspace's database keeps the ones it used; this folder (``<cache>/baselines``) lets a
new workspace (a demo started afresh, a second project on the same problem, a test) skip
measuring what another already measured with the same settings. An entry is keyed by the
definition's content hash, the workload, the device and the settings that shape the
measurement; a file that cannot be read or does not hold a baseline is a miss, never an error.
Candidate workers never see the cache folder (it is not bound into their sandbox), and a
baseline feeds the reported speedups and SOL scores (``scoring_gate``), never an ACCEPT or REVERT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from ..paths import cache_dir

log = logging.getLogger(__name__)

# raised when what a baseline holds, or how it is measured, changes: older files become misses
FORMAT = 1


def baselines_dir() -> Path:
    return cache_dir() / "baselines"


def _path(definition_hash: str, workload: str, device_key: str, settings: dict[str, Any]) -> Path:
    key = json.dumps([FORMAT, definition_hash, workload, device_key, settings], sort_keys=True)
    return baselines_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def load(definition_hash: str, workload: str, device_key: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The cached baseline, or None."""
    path = _path(definition_hash, workload, device_key, settings)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("eager"), dict):
        log.warning("ignoring a baseline cache file that holds no baseline: %s", path)
        return None
    return data


def store(
    definition_hash: str, workload: str, device_key: str, settings: dict[str, Any], result: dict[str, Any]
) -> None:
    """Write the baseline (whole or not at all: a temporary file renamed into place)."""
    path = _path(definition_hash, workload, device_key, settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)
    except OSError as exc:  # a cache: the workspace's database still has it
        log.warning("could not write the baseline cache (%s): %s", path.parent, exc)
