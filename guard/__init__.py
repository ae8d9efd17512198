"""The guard: deterministic evaluation of candidate kernels.

The cascade (static screen, build, correctness, benchmark, score, decision, archive)
lives in :mod:`guard.cascade`; problems in :mod:`guard.problems`; candidates in
:mod:`guard.candidates`; everything that touches torch runs in worker processes
(:mod:`guard.runner`), so importing this package never imports torch.
"""
