"""KV cache management: block pool, prefix cache, tiers (pure Python policy; tensors only in the mover)."""
