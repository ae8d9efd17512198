"""Per-user cache folder: device ceilings and built extensions (``KERNELARC_CACHE_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("KERNELARC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernelarc"
    )
    return Path(base)
