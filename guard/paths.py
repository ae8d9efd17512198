"""Where the guard lies and where it keeps its per-user cache (device ceilings and built
extensions, ``KERNELARC_CACHE_DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

# the ``guard`` package, and the folder that holds it: the project's checkout, or the
# site-packages folder of an installed guard (the workers import the guard from there)
GUARD_PACKAGE = Path(__file__).resolve().parent
PROJECT_ROOT = GUARD_PACKAGE.parent
# the checkout, where the guard runs from one (an installed guard's folder is the interpreter's)
CHECKOUT = None if PROJECT_ROOT.name in ("site-packages", "dist-packages") else PROJECT_ROOT


def cache_dir() -> Path:
    base = os.environ.get("KERNELARC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernelarc"
    )
    return Path(base)
