"""Compute kernels for the model runner (Triton on CUDA, a torch path on CPU)."""
