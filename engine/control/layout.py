"""Binary layout of the control block: one small file shared by the engine and its sidecar.

All integers little-endian. The file is FILE_SIZE bytes (4 KiB, one page) and is mmap'd by both
processes. Offsets are fixed by this layout version; a reader checks magic and version first and
refuses a block of another version (engine and sidecar must come from releases with the same layout).

Versions: 1, the first. 2 (same bytes, new meanings): prefix_queries_host and _disk carry the tokens
asked of those tiers (a lower tier is asked only for what the tiers above it did not serve; version 1
left them 0), requests_finished and tokens_generated are counted (version 1 left them 0). 3: the step
token budget (the third knob) in both records; the snapshot also carries what the coordinator derives
its starting cap from (block size, max context, blocks still to prefill), the rows decoding, and TPOT
percentiles.

Header, offset 0, 64 bytes, written once by whoever creates the file::

    HEADER_FMT = "<8sIIIIII"  magic b"KVLOOPCB", layout version, header size,
                              snapshot record offset, snapshot record size,
                              targets record offset, targets record size   (rest zero)

Each record (snapshot at SNAPSHOT_OFFSET, targets at TARGETS_OFFSET) is::

    RECORD_HEAD_FMT = "<QII"  seq     u64  seqlock counter: odd while a writer is inside the record
                              crc     u32  zlib.crc32 of the payload bytes
                              length  u32  payload length in bytes (must equal the format's size)
    payload                   a fixed struct, below

Writer: seq += 1 (odd), write payload, length and crc, seq += 1 (even). Reader: read seq, copy the
record, read seq again; accept the copy only when both reads are equal and even and the crc matches,
else retry a few times and then report the record as garbled. The crc also catches torn copies on
machines whose stores the seqlock alone would not order.

Snapshot payload, written by the engine every step (SNAPSHOT_FMT; names in SNAPSHOT_FIELDS)::

    start_id Q (random per engine start), step Q, time_ns q (CLOCK_REALTIME),
    num_waiting I, num_running I, num_decoding I (running rows past their prefill),
    batch_cap I, step_token_budget I (now), step_token_budget_max I (the engine's configured ceiling),
    kv_blocks_total I, kv_blocks_free I, kv_blocks_pending I (blocks the running rows' prompts still
    need: the rest of their prefill), block_size I (tokens per block), max_model_len I, _pad I,
    watermark d, kv_use_device d, kv_use_host d, kv_use_disk d,
    prefix_queries_device Q, prefix_queries_host Q, prefix_queries_disk Q,   (tokens, cumulative;
    prefix_hits_device Q, prefix_hits_host Q, prefix_hits_disk Q,             per tier: engine.core.kv_stats)
    preemptions Q, rejections Q, oom_events Q,
    requests_finished Q (any finish reason), tokens_generated Q (output tokens of finished requests),
    ttft_p50_s d, ttft_p99_s d  (over a recent window; NaN when no request has started yet),
    tpot_p50_s d, tpot_p99_s d  (time per output token after the first, of recently finished requests;
                                 NaN until one has finished with two tokens or more)

Targets payload, written by the sidecar or `kvloop control set` (TARGETS_FMT)::

    version Q (increases with every write; a reader ignores one lower than it has applied),
    time_ns q (CLOCK_REALTIME), writer_id Q (random per writer process),
    flags I (bit 0: batch_cap set, bit 1: watermark set, bit 2: step_token_budget set), batch_cap I,
    watermark d, step_token_budget I, _pad I
"""

from __future__ import annotations

import struct

MAGIC = b"KVLOOPCB"
LAYOUT_VERSION = 3
FILE_SIZE = 4096

HEADER_FMT = struct.Struct("<8sIIIIII")
HEADER_SIZE = 64
RECORD_HEAD = struct.Struct("<QII")

SNAPSHOT_FIELDS = (
    "start_id", "step", "time_ns",
    "num_waiting", "num_running", "num_decoding", "batch_cap", "step_token_budget", "step_token_budget_max",
    "kv_blocks_total", "kv_blocks_free", "kv_blocks_pending", "block_size", "max_model_len", "_pad",
    "watermark", "kv_use_device", "kv_use_host", "kv_use_disk",
    "prefix_queries_device", "prefix_queries_host", "prefix_queries_disk",
    "prefix_hits_device", "prefix_hits_host", "prefix_hits_disk",
    "preemptions", "rejections", "oom_events", "requests_finished", "tokens_generated",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
)
SNAPSHOT_FMT = struct.Struct("<QQq" + "I" * 12 + "d" * 4 + "Q" * 11 + "d" * 4)

TARGETS_FIELDS = ("version", "time_ns", "writer_id", "flags", "batch_cap", "watermark", "step_token_budget", "_pad")
TARGETS_FMT = struct.Struct("<QqQIIdII")
FLAG_BATCH_CAP = 1
FLAG_WATERMARK = 2
FLAG_STEP_TOKEN_BUDGET = 4

SNAPSHOT_OFFSET = HEADER_SIZE
SNAPSHOT_SIZE = 512  # room to grow the payload without moving the targets record
TARGETS_OFFSET = SNAPSHOT_OFFSET + SNAPSHOT_SIZE
TARGETS_SIZE = 128

assert len(SNAPSHOT_FIELDS) == len(SNAPSHOT_FMT.unpack(bytes(SNAPSHOT_FMT.size)))
assert RECORD_HEAD.size + SNAPSHOT_FMT.size <= SNAPSHOT_SIZE
assert RECORD_HEAD.size + TARGETS_FMT.size <= TARGETS_SIZE
assert TARGETS_OFFSET + TARGETS_SIZE <= FILE_SIZE


def header_bytes() -> bytes:
    head = HEADER_FMT.pack(MAGIC, LAYOUT_VERSION, HEADER_SIZE, SNAPSHOT_OFFSET, SNAPSHOT_SIZE,
                           TARGETS_OFFSET, TARGETS_SIZE)
    return head.ljust(HEADER_SIZE, b"\0")
