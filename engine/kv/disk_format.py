"""On-disk block files (pure Python): `KVLB`, a version, a JSON header (hash, model fingerprint, dtype,
shape, payload size, CRC-32 checksum), then the raw K/V bytes of one block for every layer.
Anything that does not check out raises BadBlockFile; the caller treats it as a miss and deletes it."""

from __future__ import annotations

import json
import struct
import zlib

from kvloop.engine.kv.hashing import hash_hex

MAGIC = b"KVLB"
VERSION = 1
SUFFIX = ".kvb"
_PREFIX = struct.Struct("<4sHI")  # magic, version, header length


class BadBlockFile(ValueError):
    pass


def file_name(h: int) -> str:
    return hash_hex(h) + SUFFIX


def parse_name(name: str) -> int | None:
    stem = name.removesuffix(SUFFIX)
    if name == stem or len(stem) != 32:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def checksum(payload: memoryview | bytes) -> int:
    return zlib.crc32(payload)


def encode_header(h: int, fingerprint: str, dtype: str, shape: list[int],
                  payload: memoryview | bytes) -> bytes:
    meta = {"hash": hash_hex(h), "fingerprint": fingerprint, "dtype": dtype, "shape": list(shape),
            "nbytes": len(payload), "checksum": checksum(payload)}
    body = json.dumps(meta, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(body)) + body


def decode(buf: memoryview, h: int, fingerprint: str, dtype: str, shape: list[int]) -> memoryview:
    """Checks the header against what this engine expects; returns the payload."""
    if len(buf) < _PREFIX.size:
        raise BadBlockFile("truncated header")
    magic, version, length = _PREFIX.unpack(buf[: _PREFIX.size])
    if magic != MAGIC or version != VERSION:
        raise BadBlockFile("not a kvloop block file")
    start = _PREFIX.size + length
    try:
        meta = json.loads(bytes(buf[_PREFIX.size:start]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadBlockFile("unreadable header") from e
    expected = {"hash": hash_hex(h), "fingerprint": fingerprint, "dtype": dtype, "shape": list(shape)}
    for key, value in expected.items():
        if meta.get(key) != value:
            raise BadBlockFile(f"{key} mismatch")
    payload = buf[start:]
    if len(payload) != meta.get("nbytes"):
        raise BadBlockFile("truncated payload")
    if checksum(payload) != meta.get("checksum"):
        raise BadBlockFile("checksum mismatch")
    return payload
