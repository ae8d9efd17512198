"""Shipped problems, one folder each, with their seed kernels (``seed_*.py``, ``seed_*.cu``)."""

from pathlib import Path

SEEDS_DIR = Path(__file__).resolve().parent
