"""The guard's cascade: static screen, build, correctness, benchmark, score, decision,
archive. ``Guard.evaluate`` is the one entry point the CLI, the MCP server and the tests
share. The parent process never imports torch: candidates, references, comparisons and
timing all run in worker processes (guard.runner).

One module per concern: ``guard`` (the Guard: lifecycle and the order of the gates),
``context`` (what one evaluation's gates share), ``reference_side`` (the trusted worker,
ceilings, baselines, seeds, the timing slot), ``correctness_gate``, ``benchmark_gate``,
``pairing_gate``, ``scoring_gate``, ``recording`` (decision and archive) and ``reasons``
(rejections and errors)."""

from .guard import Guard
from .reasons import GuardError
from .reference_side import ceilings_cache_dir

__all__ = ["Guard", "GuardError", "ceilings_cache_dir"]
