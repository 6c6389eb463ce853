"""Chained block hashes: a full block's key covers its parent's key, its token ids and extra keys
(model fingerprint, dtype), so equal keys mean equal K/V for the same model (pure Python).

Two key functions with one call, `keys(tokens, num_blocks=None, parent=ROOT, start=0) -> list[int]`:
- `ChainHasher`: blake2b over the packed ids, remembered per block. The engine's: its keys name disk files and
  must stay the same across processes and versions (kv.disk_format).
- `TupleChainKeys`: Python's own hash of (parent key, token ids), folded to 64 bits. The simulator's: it
  writes no files, so its keys need only be distinct and the same in every run."""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Callable, Sequence

ROOT = 0  # the parent of a sequence's first block
# keys(tokens, num_blocks=None, parent=ROOT, start=0): the chained keys of full blocks start, start+1, ...
BlockKeys = Callable[..., list[int]]


def block_hash(parent: int, tokens: Sequence[int], extra: bytes) -> int:
    return _packed_hash(parent, array("q", tokens).tobytes(), extra)


def _packed_hash(parent: int, packed_tokens: bytes, extra: bytes) -> int:
    data = parent.to_bytes(16, "little") + packed_tokens + extra  # one update: same digest
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "little")


def chain_hashes(tokens: Sequence[int], block_size: int, extra: bytes, num_blocks: int | None = None,
                 parent: int = ROOT, start: int = 0, memo: ChainHasher | None = None) -> list[int]:
    """Keys of the full blocks start, start+1, ... (at most num_blocks of them), read
    from `memo` where given."""
    end = len(tokens) // block_size
    if num_blocks is not None:
        end = min(end, start + num_blocks)
    out: list[int] = []
    if end <= start:
        return out
    # block_hash of each block, with the token ids packed once for them all
    ids = tokens[start * block_size : end * block_size]
    packed = struct.pack(f"{len(ids)}q", *ids)  # array("q", ids).tobytes(), several times faster from a list
    width = 8 * block_size  # bytes of a block's ids ("q": 8 each)
    for i in range(end - start):
        block = packed[i * width : (i + 1) * width]
        parent = _packed_hash(parent, block, extra) if memo is None else memo[parent, block]
        out.append(parent)
    return out


class ChainHasher(dict):
    """chain_hashes for one block size and extra key, remembering the keys of recent blocks: the documents and
    chat histories that many prompts begin with are hashed once, not once per prompt (a block's key is a
    function of its parent's key and its token ids, so a remembered key is the key). As a mapping:
    (parent key, packed token ids) -> key, computed where missing. Memory stays bounded: when `capacity`
    blocks are remembered they become the old generation, kept while the new one fills, and the blocks asked
    for again are carried over (about 300 bytes a block of 16 tokens: ~20 MB at most)."""

    def __init__(self, block_size: int, extra: bytes, capacity: int = 1 << 15):
        super().__init__()
        self.block_size, self.extra, self.capacity = block_size, extra, capacity
        self._old: dict[tuple[int, bytes], int] = {}

    def __call__(self, tokens: Sequence[int], num_blocks: int | None = None, parent: int = ROOT,
                 start: int = 0) -> list[int]:
        if len(self) > self.capacity:
            self._old = dict(self)
            self.clear()
        return chain_hashes(tokens, self.block_size, self.extra, num_blocks, parent, start, self)

    def __missing__(self, key: tuple[int, bytes]) -> int:
        h = self._old.get(key)
        if h is None:
            h = _packed_hash(*key, self.extra)
        self[key] = h
        return h


class TupleChainKeys:
    """Chained block keys from Python's hash of the pair (parent key, the block's token
    ids as a tuple), folded to
    64 bits, the first block's parent being a salt that stands for the extra key: about five times cheaper
    than ChainHasher's blake2b and memo (no bytes to pack, nothing to remember; the blocks are cut into tuples
    in C), and the same in every process (ints and tuples of ints hash alike everywhere; only str and bytes
    are salted per process). For the simulator, which hashes every prompt it admits and every block its rows
    fill: at 80 requests/s on an H200 profile, ChainHasher took a fifth of a continuous+lru run. Two distinct
    blocks collide with odds about 2^-61 (Python hashes an int modulo 2^61 - 1; a simulated hour holds ~10^6
    blocks: ~10^-7 for any collision)."""

    MASK = (1 << 64) - 1

    def __init__(self, block_size: int, extra: bytes):
        self.block_size = block_size
        self.salt = int.from_bytes(hashlib.blake2b(extra, digest_size=8).digest(), "little")

    def __call__(self, tokens: Sequence[int], num_blocks: int | None = None, parent: int = ROOT,
                 start: int = 0) -> list[int]:
        bs = self.block_size
        end = len(tokens) // bs
        if num_blocks is not None:
            end = min(end, start + num_blocks)
        if parent == ROOT:
            parent = self.salt
        mask, out = self.MASK, []
        # each block's ids, a tuple
        for block in zip(*[iter(tokens[start * bs : end * bs])] * bs, strict=True):
            parent = hash((parent, block)) & mask
            out.append(parent)
        return out


def hash_hex(h: int) -> str:
    return f"{h:032x}"
