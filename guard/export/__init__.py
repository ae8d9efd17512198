"""Results written out in public formats: SOL-ExecBench traces and solutions."""
