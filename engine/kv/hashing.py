"""Chained block hashes: a full block's key covers its parent's key, its token ids and extra keys
(model fingerprint, dtype), so equal keys mean equal K/V for the same model (pure Python)."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT = 0  # the parent of a sequence's first block


def block_hash(parent: int, tokens: Sequence[int], extra: bytes) -> int:
    return _packed_hash(parent, array("q", tokens).tobytes(), extra)


def _packed_hash(parent: int, packed_tokens: bytes, extra: bytes) -> int:
    data = parent.to_bytes(16, "little") + packed_tokens + extra  # one update: same digest
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "little")


def chain_hashes(tokens: Sequence[int], block_size: int, extra: bytes, num_blocks: int | None = None,
                 parent: int = ROOT, start: int = 0) -> list[int]:
    """Keys of the full blocks start, start+1, ... (at most num_blocks of them)."""
    end = len(tokens) // block_size
    if num_blocks is not None:
        end = min(end, start + num_blocks)
    out: list[int] = []
    if end <= start:
        return out
    # block_hash of each block, with the token ids packed once for them all
    packed = array("q", tokens[start * block_size : end * block_size]).tobytes()
    width = 8 * block_size  # bytes of a block's ids ("q": 8 each)
    for i in range(end - start):
        parent = _packed_hash(parent, packed[i * width : (i + 1) * width], extra)
        out.append(parent)
    return out


def hash_hex(h: int) -> str:
    return f"{h:032x}"
