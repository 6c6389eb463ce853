"""Attention backends behind one interface (backend.py: registry; torch on CPU, Triton on CUDA), the step's
attention metadata, and the float64-capable torch reference the tests and the GPU check compare against."""
