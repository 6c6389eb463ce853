"""Binary layout of the control block: one small file shared by the engine and its sidecar.

All integers little-endian. The file is FILE_SIZE bytes (4 KiB, one page) and is mmap'd by both
processes. Offsets are fixed by this layout version; a reader checks magic and version first and
refuses a block of another version (engine and sidecar must come from releases with the same layout).

Versions: 1, the first. 2 (same bytes, new meanings): prefix_queries_host and _disk carry the tokens
asked of those tiers (a lower tier is asked only for what the tiers above it did not serve; version 1
left them 0), requests_finished and tokens_generated are counted (version 1 left them 0). 3: the step
token budget (the third knob) in both records; the snapshot also carries what the coordinator derives
its starting cap from (block size, max context, blocks still to prefill), the rows decoding, and TPOT
percentiles. 4: the SLO counts (good, missed by reason, slack) the goodput coordinator steers on.
5: the speculation cap (the fourth knob, engine/core/knobs.py) in the targets record; it takes the word
that padded version 4's targets, so no byte of either record moves, but a version-4 writer leaves the
field 0 and its flags bit clear.

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

Payloads: the snapshot, written by the engine every step, and the targets, written by the sidecar or
`kvloop control set`. Their fields, in byte order, come from the tables in fields.py (SNAPSHOT_FIELDS,
SNAPSHOT_FMT, TARGETS_FIELDS, TARGETS_FMT below are derived from them); listed at the end of this text.
A table change that moves bytes must raise LAYOUT_VERSION (tests/control pin the version's formats).
"""

from __future__ import annotations

import struct

from kvloop.engine.control import fields as F

MAGIC = b"KVLOOPCB"
LAYOUT_VERSION = 5
FILE_SIZE = 4096

HEADER_FMT = struct.Struct("<8sIIIIII")
HEADER_SIZE = 64
RECORD_HEAD = struct.Struct("<QII")

SNAPSHOT_FIELDS = tuple(f.name for f in F.SNAPSHOT)
SNAPSHOT_FMT = struct.Struct("<" + "".join(f.code for f in F.SNAPSHOT))
TARGETS_FIELDS = tuple(f.name for f in F.TARGETS)
TARGETS_FMT = struct.Struct("<" + "".join(f.code for f in F.TARGETS))

SNAPSHOT_OFFSET = HEADER_SIZE
SNAPSHOT_SIZE = 512  # room to grow the payload without moving the targets record
TARGETS_OFFSET = SNAPSHOT_OFFSET + SNAPSHOT_SIZE
TARGETS_SIZE = 128

assert RECORD_HEAD.size + SNAPSHOT_FMT.size <= SNAPSHOT_SIZE
assert RECORD_HEAD.size + TARGETS_FMT.size <= TARGETS_SIZE
assert TARGETS_OFFSET + TARGETS_SIZE <= FILE_SIZE


def header_bytes() -> bytes:
    head = HEADER_FMT.pack(MAGIC, LAYOUT_VERSION, HEADER_SIZE, SNAPSHOT_OFFSET, SNAPSHOT_SIZE,
                           TARGETS_OFFSET, TARGETS_SIZE)
    return head.ljust(HEADER_SIZE, b"\0")


if __doc__:  # None under python -OO
    __doc__ += ("\nSnapshot payload (fields.SNAPSHOT)::\n\n" + F.describe(F.SNAPSHOT)
                + "\n\nTargets payload (fields.TARGETS)::\n\n" + F.describe(F.TARGETS) + "\n")
