"""The remote KV tier's Redis/Valkey backend (kv.remote_tier's RemoteStore) over redis-py.

redis://HOST:PORT/DB, rediss://... for TLS (redis-py's ssl options from the URL's query, e.g.
?ssl_cert_reqs=required&ssl_ca_certs=/path), unix:///path/to.sock. The password comes from the caller (the
environment), never the URL. Every call has the timeout of --kv-remote-timeout-ms for connecting and for each
socket read, and redis-py's own retries are off: a store that does not answer is one error, at once, and the
caller degrades to misses (kv.remote_client). Values may carry a TTL; the bound on memory is the server's
(`maxmemory` with `maxmemory-policy allkeys-lru`)."""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvloop.engine.kv.remote_tier import RemoteStoreError

GET_CHUNK = 16  # keys per MGET: a reply of at most 16 blocks (32 MiB of an 8B model's bf16 blocks)


class RedisStore:
    def __init__(self, url: str, timeout_s: float, password: str | None = None, ttl_s: int | None = None):
        self.ttl_s = ttl_s
        self.client = redis.Redis.from_url(url, password=password or None, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
                                           retry_on_timeout=False, health_check_interval=0)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        try:
            for i in range(0, len(keys), GET_CHUNK):
                out += self.client.mget(keys[i : i + GET_CHUNK])
        except (redis.RedisError, OSError) as e:
            raise RemoteStoreError(str(e) or type(e).__name__) from e
        return out

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items:
                pipe.set(key, value, ex=self.ttl_s)
            pipe.execute()
        except (redis.RedisError, OSError) as e:
            raise RemoteStoreError(str(e) or type(e).__name__) from e

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        try:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(key)
            return [bool(n) for n in pipe.execute()]
        except (redis.RedisError, OSError) as e:
            raise RemoteStoreError(str(e) or type(e).__name__) from e

    def ping(self) -> None:
        try:
            self.client.ping()
        except (redis.RedisError, OSError) as e:
            raise RemoteStoreError(str(e) or type(e).__name__) from e

    def close(self) -> None:
        self.client.close()
