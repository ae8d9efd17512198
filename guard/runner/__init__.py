"""Worker processes: where candidate code runs (candidate role) and where references,
comparisons and baselines run (trusted role). The parent side (process, pool, protocol)
imports no torch; the worker side (worker_main and what it imports) does."""
