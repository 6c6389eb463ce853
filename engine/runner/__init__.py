"""Model execution: runner, cascade planning, sampler (torch)."""
