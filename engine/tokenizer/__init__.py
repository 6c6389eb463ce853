"""Tokenizer, chat template and streaming detokenization (no torch)."""
