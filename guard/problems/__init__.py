"""Problems in the SOL-ExecBench / FlashInfer-Trace schema, with KernelArc's own fields."""
