"""The remote KV tier's store interface (pure Python): a key-value service below the host and disk tiers that
several engines share, so a block one pod computed is a hit on the others.

A backend is one class with four calls on byte strings, keyed by strings this module builds:
`get_many(keys) -> [bytes | None]`, `put_many([(key, value)])`, `contains_many(keys) -> [bool]`, `ping()`,
plus `close()`; every failure (refused, timed out, reset) raises RemoteStoreError. The first backend is Redis
or Valkey (kv.redis_store); a Mooncake-store or LMCache-server backend is another such file and a scheme in
`open_store`.

Keys: `kvloop:kv:<namespace>:<block hash>`, the namespace a digest of the model fingerprint, the KV dtype,
the block size and the KV layout (layers, K/V, tokens, heads, head dim), so engines that could not use each
other's K/V never read each other's values. Values are the disk tier's block format (kv.disk_format: header
with hash, fingerprint, dtype, shape, size and CRC-32, then the raw K/V), checked on every read: a corrupt,
truncated or foreign value is a miss. The store bounds itself: run it with `maxmemory` and
`maxmemory-policy allkeys-lru` (Redis/Valkey), so old blocks leave as new ones come; values may also carry a
TTL (KVConfig.remote_ttl_s)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

from kvloop.engine.kv.hashing import hash_hex

PASSWORD_ENV = "KVLOOP_KV_REMOTE_PASSWORD"  # the store's password: never a flag or part of the URL
KEY_PREFIX = "kvloop:kv:"
SCHEMES = ("redis", "rediss", "unix")  # rediss: TLS; unix: a local socket path


class RemoteStoreError(RuntimeError):
    """The store did not answer (refused, timed out, connection lost) or answered with an error."""


class RemoteStore(Protocol):
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...
    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None: ...
    def contains_many(self, keys: Sequence[str]) -> list[bool]: ...
    def ping(self) -> None: ...
    def close(self) -> None: ...


def check_url(url: str) -> None:
    """A clear error for a URL the remote tier cannot use (empty: no remote tier)."""
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"kv_remote_url: scheme must be one of {', '.join(s + '://' for s in SCHEMES)}, "
                         f"not {url.split('://')[0]!r}")
    if parts.password:
        raise ValueError(f"kv_remote_url: put the password in the environment variable {PASSWORD_ENV}, "
                         "not in the URL")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("kv_remote_url: no host (redis://HOST:PORT/DB)")


def redacted(url: str) -> str:
    """The URL for logs: scheme, host, port and path (no user name)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def namespace(fingerprint: str, dtype: str, block_shape: Sequence[int]) -> str:
    """What engines must agree on to share a value: model, KV dtype, block size and KV layout (block_shape is
    [layers, 2, block_size, kv_heads, head_dim])."""
    text = f"{fingerprint}|{dtype}|{'x'.join(map(str, block_shape))}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def block_key(ns: str, h: int) -> str:
    return f"{KEY_PREFIX}{ns}:{hash_hex(h)}"


def open_store(url: str, timeout_s: float, password: str | None, ttl_s: int = 0) -> RemoteStore:
    """The backend for the URL's scheme (imported only when used); ttl_s > 0: values expire after it."""
    check_url(url)
    from kvloop.engine.kv.redis_store import RedisStore  # redis, rediss and unix sockets

    return RedisStore(url, timeout_s, password, ttl_s or None)
