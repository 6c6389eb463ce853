"""The block hashes KV events carry (pure Python; runs on the publisher's thread, off the step's path).

- `kvloop` (default): the engine's own chain keys folded to 63 bits: opaque ids of a consistent parent chain,
  each event carrying its blocks' token ids; enough for a consumer that keys its index by the events'
  hashes or hashes the token ids itself.
- `vllm_sha256_cbor_64bit`: what a router that hashes the prompt itself and looks the result up among the
  published hashes needs, as llm-d's precise prefix scorer does (llm-d/llm-d-kv-cache-manager,
  pkg/kvcache/kvblock/token_processor.go, "aligned with vLLM"): the root is the low 64 bits (the last 8
  bytes, big-endian) of SHA-256 over the canonical CBOR of the hash seed (a string; vLLM reads it from
  PYTHONHASHSEED), and each block's hash the same of [parent hash, the block's token ids, null]. The
  router's seed and chunk size must equal --kv-events-hash-seed and the engine's block size. Kept per
  indexed block (a dict the size of the device index) so that children find their parent's hash."""

from __future__ import annotations

import hashlib
from typing import Protocol

from kvloop.engine.kv.hashing import ROOT
from kvloop.engine.kv.kv_events import wire_hash

HASH_KINDS = ("kvloop", "vllm_sha256_cbor_64bit")


class WireHashes(Protocol):
    def stored(self, h: int, parent: int, ids: list[int]) -> tuple[int, int | None] | None:
        """(block hash, parent hash or None at the root) on the wire; None: not publishable."""

    def removed(self, h: int) -> int | None: ...

    def cleared(self) -> None: ...


class KvloopHashes:
    def stored(self, h: int, parent: int, ids: list[int]) -> tuple[int, int | None]:
        return wire_hash(h), None if parent == ROOT else wire_hash(parent)

    def removed(self, h: int) -> int:
        return wire_hash(h)

    def cleared(self) -> None:
        return


def sha256_cbor_64bit(value: object) -> int:
    import cbor2  # only where this hashing is asked for

    digest = hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()
    return int.from_bytes(digest[-8:], "big")


class VllmCborHashes:
    def __init__(self, seed: str = ""):
        self.root = sha256_cbor_64bit(seed)
        self._of: dict[int, int] = {}  # kvloop key -> its published hash, while indexed
        self.orphans = 0  # stored blocks whose parent's hash was not known (not published)

    def stored(self, h: int, parent: int, ids: list[int]) -> tuple[int, int | None] | None:
        parent_hash = self.root if parent == ROOT else self._of.get(parent)
        if parent_hash is None:
            self.orphans += 1
            return None
        out = self._of[h] = sha256_cbor_64bit([parent_hash, ids, None])
        return out, None if parent == ROOT else parent_hash

    def removed(self, h: int) -> int | None:
        return self._of.pop(h, None)

    def cleared(self) -> None:
        self._of.clear()


def make_wire_hashes(kind: str, seed: str = "") -> WireHashes:
    if kind == "kvloop":
        return KvloopHashes()
    if kind == "vllm_sha256_cbor_64bit":
        return VllmCborHashes(seed)
    raise ValueError(f"unknown KV event hash {kind!r}; one of {HASH_KINDS}")
