"""hybridpar's planner: pure Python (no torch), fast enough to search 16,384 GPUs in under a second."""
