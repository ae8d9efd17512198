"""Long-term knowledge as data: optimization methods by tier, backend, architecture and
bottleneck (``methods/*.json``; schema and loader in ``memory/playbook.py``), and the
strategy prompts a swarm hands its agents (``strategies/*.md``). The launcher assigns the
strategies and the server offers them as MCP prompts; both read them here."""

from pathlib import Path

METHODS_DIR = Path(__file__).resolve().parent / "methods"
STRATEGIES_DIR = Path(__file__).resolve().parent / "strategies"


def strategies() -> dict[str, str]:
    """Strategy name -> prompt template (with a ``{problem}`` placeholder)."""
    return {p.stem: p.read_text() for p in sorted(STRATEGIES_DIR.glob("*.md"))}
