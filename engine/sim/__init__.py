"""GPU-scale simulator: the real scheduler, KV manager and sidecar control law on a roofline cost
model and a virtual clock (pure Python: nothing in this package imports torch)."""
