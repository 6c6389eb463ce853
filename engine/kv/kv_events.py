"""KV cache events in vLLM's wire format: the structures a router decodes (msgspec; pure Python).

What the format is, and what its consumers read (facts gathered for issue 55, with their sources):

- vLLM (vllm-project/vllm, vllm/distributed/kv_events.py): an `EventBatch` of `ts` (float, seconds since
  the epoch) and `events`, optionally `data_parallel_rank`; events are a tagged union of `BlockStored`
  (block_hashes, parent_block_hash or None, token_ids of all the stored blocks, block_size, lora_id,
  medium; later versions add lora_name, extra_keys, group_idx and cache-spec fields, all defaulted),
  `BlockRemoved` (block_hashes, medium) and `AllBlocksCleared` (no fields). msgspec structs with
  `tag=True` (the tag is the class name) and, in the releases routers were written against (e.g. commit
  b4e69e0), `array_like=True` and `omit_defaults=True`: a batch is the msgpack array [ts, [events...]] and
  an event is [tag, field, field, ...], trailing default fields left out. A later main (commit 0181ea3)
  drops array_like (maps); the array form is what the routers below decode, so it is the one sent here.
  The medium names vLLM uses: "GPU" (MEDIUM_GPU) for the device, "CPU" for its CPU offload.
- The transport (same file, ZmqEventPublisher): a PUB socket (bound when the endpoint has `*`, `::`,
  ipc:// or inproc://, else connected) sends each batch as the multipart message [topic, sequence number
  as 8 bytes big-endian, msgpack payload], sequence numbers counting up from 0 per publisher. An optional
  ROUTER socket serves replays: a request [identity, b"", start sequence as 8 bytes big-endian] is answered
  with [identity, b"", seq, payload] for each buffered batch from that sequence on, then
  [identity, b"", -1 as 8 signed bytes, b""]. vLLM keeps 10,000 batches for replay.
- llm-d (llm-d/llm-d-kv-cache-manager, pkg/kvcache/kvevents/pool.go, events.go, zmq_subscriber.go):
  a SUB socket expects exactly three frames, reads the pod (and in later versions the model) from the
  topic ("kv@<pod>@<model>", the filter "kv@"), decodes the batch as an array of 2 or 3 elements and each
  event as an array led by its tag string; block hashes may be uint64 or bytes (then the last 8 bytes,
  big-endian); medium lower-cased is the tier (default "gpu"); AllBlocksCleared is ignored. Its index is
  keyed by the published block hashes, and the scorer hashes the prompt itself
  (pkg/kvcache/kvblock/token_processor.go: SHA-256 of canonical CBOR of [parent, tokens, null], the low
  64 bits, the root from the hash seed), so llm-d's precise scorer matches only vLLM's own sha256_cbor
  hashing with the same seed and block size: kvloop's keys are not that hash (see below).
- vllm-router 0.1.17 (PyPI, Rust): `--policy kv_aware --kv-event-source WORKER_URL=ENDPOINT`,
  `--kv-event-replay-source`, `--kv-event-block-size` (default 16), `--kv-event-model`; its wheel carries a
  module kv_index with `local_block_hashes`, a radix tree indexer and a replay subscriber, and hash modes
  named after vLLM's (python hash seed, sha256, xxhash, cbor). Dynamo's KV router (ai-dynamo/dynamo,
  docs/pages/integrations/kv-events-custom-engines.md) takes the same three events relayed from a ZMQ
  socket and recomputes its own block hashes from each stored event's token_ids, keeping the engine's
  hashes only as ids for parents and removals.

So each event here carries the block's token ids and a parent chain that is consistent on its own: a
router that hashes token ids itself (Dynamo; vllm-router's local hashes) needs nothing more, and the
hashes we publish are kvloop's chain keys folded to 64 bits (`wire_hash`): msgpack integers stop at 64 bits,
and both uint64 consumers above accept them."""

from __future__ import annotations

from typing import Any

import msgspec

MEDIUM_GPU = "GPU"  # vLLM's name for the device pool (MEDIUM_GPU)
MEDIUM_CPU = "CPU"  # vLLM's CPU offload medium
_MASK64 = (1 << 64) - 1


def wire_hash(h: int) -> int:
    """A kvloop chain key (128 bits) as the uint64 block hash on the wire: its low 64 bits."""
    return h & _MASK64


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three events: an array led by the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """[ts, events]: vLLM's optional third element, data_parallel_rank, is left out (one engine, no data
    parallel ranks; msgspec writes a trailing None where the field exists)."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# The same events as tagged maps ({"type": "BlockStored", "block_hashes": ...}) inside the array batch: what
# vllm-router 0.1.17's decoder takes (its wheel's messages: "KV event batch must be an array", "KV event must
# be a tagged map", "KV event keys must be strings"); later vLLM versions write their events as maps too.
class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _BlockStoredMap(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class _BlockRemovedMap(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _AllBlocksClearedMap(_MapEvent, tag="AllBlocksCleared"):
    pass


class _KVEventBatchMaps(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_BlockStoredMap | _BlockRemovedMap | _AllBlocksClearedMap]


_AS_MAP = {BlockStored: _BlockStoredMap, BlockRemoved: _BlockRemovedMap,
           AllBlocksCleared: _AllBlocksClearedMap}
ENCODINGS = ("array", "map")  # events as arrays (vLLM's array_like structs; llm-d) or as tagged maps


def as_encoded(batch: KVEventBatch, encoding: str) -> msgspec.Struct:
    """The batch as `encoding` writes it (ENCODINGS)."""
    if encoding == "array":
        return batch
    if encoding != "map":
        raise ValueError(f"unknown KV event encoding {encoding!r}; one of {ENCODINGS}")
    return _KVEventBatchMaps(batch.ts, [_AS_MAP[type(e)](*msgspec.structs.astuple(e)) for e in batch.events])


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload as a subscriber reads it (tests, tools)."""
    return msgspec.msgpack.decode(payload, type=KVEventBatch)


def encoder() -> Any:
    return msgspec.msgpack.Encoder()
