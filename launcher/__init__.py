"""Swarm launcher: strategy prompts (``strategies/*.md``), worktrees, agent clients,
monitoring and reports."""

from pathlib import Path

STRATEGIES_DIR = Path(__file__).resolve().parent / "strategies"


def strategies() -> dict[str, str]:
    """Strategy name -> prompt template (with a ``{problem}`` placeholder)."""
    return {p.stem: p.read_text() for p in sorted(STRATEGIES_DIR.glob("*.md"))}
