"""Long-term knowledge as data: optimization methods by tier, backend, architecture and
bottleneck (``methods/*.json``; schema and loader in ``memory/playbook.py``)."""

from pathlib import Path

METHODS_DIR = Path(__file__).resolve().parent / "methods"
