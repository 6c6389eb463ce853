"""Model execution: attention metadata, runner, sampler (torch)."""
