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
  drops array_like: events become maps tagged by "type".
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
- vllm-router 0.1.17 (PyPI, Rust): `--policy kv_aware --kv-event-source WORKER_URL=ENDPOINT` (tcp://HOST:PORT
  only, connected to), `--kv-event-replay-source`, `--kv-event-block-size` (default 16), `--kv-event-model`
  (required with static sources). Its wheel's messages name its decoder: "KV event batch must be an
  array", "KV batch requires timestamp, events, and optional rank", "KV event must be a tagged map", "KV
  event keys must be strings", "KV wire hash must be bytes or an unsigned integer"; field names include
  vLLM's later ones (lora_name, extra_keys, group_idx, kv_cache_spec_kind) and its own `ownership`. What
  it needs (its debug log in front of live kvloop servers, and its source, src/kv_index/subscriber.rs and
  indexer.rs): the SUB connects, so the publisher binds; static sources subscribe to the empty topic; a
  BlockStored must carry lora_id and lora_name (nil is fine: "missing KV event field: lora_id"); the index
  keys each block by SHA-256 of its token ids (u32 little-endian, lora_name first when set) in a radix tree
  walked from the root, the event hashes only chaining parents and naming removals, so any consistent
  hashing works; the request's ids come from the worker's /v1/*/render. Dynamo's KV router (ai-dynamo/dynamo,
  docs/pages/integrations/kv-events-custom-engines.md) relays the same three events from a ZMQ socket:
  frames [topic, 8-byte big-endian sequence, payload], payload [timestamp, [events], dp_rank], each event
  a map with a "type" field, block hashes documented as signed 64-bit integers, parent required for all
  but a sequence's first block.

So each event here carries the block's token ids and a parent chain that is consistent on its own, and
the hashes are kvloop's chain keys folded to 63 bits by default (`wire_hash`: msgpack integers stop at 64
bits, and a non-negative 63-bit value is valid for the signed and the unsigned readers above); a router
that recomputes vLLM's hashes from the prompt (llm-d) gets them from kv/event_hashes.py. Events go out as
tagged maps in the array batch (`map`, default: vllm-router's and Dynamo's form) or as arrays (`array`: the
form llm-d's decoder above reads)."""

from __future__ import annotations

import os
from typing import Any

import msgspec

MEDIUM_GPU = "GPU"  # vLLM's name for the device pool (MEDIUM_GPU)
MEDIUM_CPU = "CPU"  # vLLM's CPU offload medium
_MASK63 = (1 << 63) - 1


def expanded_topic(topic: str) -> str:
    """The topic with environment variables expanded (`kv@${POD_IP}:8000@model`: the operator renders one
    template for every pod and the kubelet sets POD_IP in each; an unset variable stays as written)."""
    return os.path.expandvars(topic)


def wire_hash(h: int) -> int:
    """A kvloop chain key (128 bits) as the block hash on the wire: its low 63 bits, a non-negative integer
    that every consumer above reads (Dynamo: signed 64-bit; vllm-router: unsigned, negatives refused)."""
    return h & _MASK63


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
    """[ts, events, data_parallel_rank]: one engine, rank 0 (written: Dynamo's documented form has it;
    llm-d and vllm-router take 2 or 3 elements)."""

    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int = 0


# The same events as tagged maps ({"type": "BlockStored", "block_hashes": ...}) inside the array batch: what
# vllm-router 0.1.17's decoder takes (its wheel's messages: "KV event batch must be an array", "KV event must
# be a tagged map", "KV event keys must be strings") and Dynamo documents (docs/pages/integrations/
# kv-events-custom-engines.md: "[timestamp, [events], dp_rank]", each event "a dictionary with a type field").
# Every field is written, None as nil, with vLLM's later lora_name: vllm-router 0.1.17 refuses a BlockStored
# without lora_id or lora_name ("kv_index decode batch: missing KV event field: lora_id", then the same for
# lora_name, in its log in front of kvloop).
class _MapEvent(msgspec.Struct, gc=False, tag=True):
    pass


class _BlockStoredMap(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class _BlockRemovedMap(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _AllBlocksClearedMap(_MapEvent, tag="AllBlocksCleared"):
    pass


class _KVEventBatchMaps(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_BlockStoredMap | _BlockRemovedMap | _AllBlocksClearedMap]
    data_parallel_rank: int = 0


_AS_MAP = {BlockStored: _BlockStoredMap, BlockRemoved: _BlockRemovedMap,
           AllBlocksCleared: _AllBlocksClearedMap}
ENCODINGS = ("map", "array")  # events as tagged maps (default) or as arrays (vLLM's array_like; llm-d)


def as_encoded(batch: KVEventBatch, encoding: str) -> msgspec.Struct:
    """The batch as `encoding` writes it (ENCODINGS)."""
    if encoding == "array":
        return batch
    if encoding != "map":
        raise ValueError(f"unknown KV event encoding {encoding!r}; one of {ENCODINGS}")
    return _KVEventBatchMaps(batch.ts, [_AS_MAP[type(e)](*msgspec.structs.astuple(e)) for e in batch.events],
                             batch.data_parallel_rank)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload as a subscriber reads it (tests, tools)."""
    return msgspec.msgpack.decode(payload, type=KVEventBatch)


def encoder() -> Any:
    return msgspec.msgpack.Encoder()
