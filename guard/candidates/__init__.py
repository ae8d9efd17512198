"""Candidates: SOL-ExecBench solutions, or one source file turned into one."""
