"""Scheduling: sequences, batches and the continuous batcher (pure Python, no torch)."""
