"""Targets the driver sends requests to: the in-process engine, OpenAI-compatible and llama.cpp HTTP
endpoints, transformers `generate`, and a static-batching gate in front of any of them."""
