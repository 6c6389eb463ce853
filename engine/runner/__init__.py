"""Model execution: runner, sampler (torch); the cascade plan it runs comes from engine/cascade."""
