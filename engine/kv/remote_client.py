"""The engine's side of the remote KV tier (pure Python; the tier mover turns tensors into bytes and back):
values in the disk tier's checked format, writes behind through a bounded queue and one writer thread,
reads timed into the load-or-recompute prices, and the store's health.

Health. The store is up until a call fails (refused, timed out past --kv-remote-timeout-ms, an error reply):
then it is down, which is one warning in the log and `remote_errors` counting each failed call. While it is
down every read is a miss and every write is dropped at once (counted), so the step never waits on it; the
writer thread alone tries it again (a PING), after 0.5 s and then twice as long each time up to 30 s, and its
first answer is one log line and the store is up again. A value that fails its checks is a miss too
(`remote_bad_values`), never a wrong token.

Prices. Each read (and each batch of writes: the same link) is timed and reported to TierCosts as seconds
per block of the "remote" tier, from a prior of the block's bytes over 1 GB/s; a failed read reports the
time it took. So a slow link makes blocks_to_use recompute instead of loading."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from kvloop.engine.core.kv_stats import KVStats
from kvloop.engine.kv import disk_format as fmt
from kvloop.engine.kv.load_or_recompute import TierCosts
from kvloop.engine.kv.remote_tier import RemoteStore, RemoteStoreError, block_key, namespace, redacted

log = logging.getLogger("kvloop.kv.remote")

RETRY_S = 0.5  # first wait before trying a store that failed
MAX_RETRY_S = 30.0
WRITE_BATCH = 8  # queued writes sent in one pipeline
_WAKE = object()  # queued by a failure on the step's thread: the writer starts its retries


class Ready(Protocol):
    def synchronize(self) -> None: ...


class RemoteKV:
    def __init__(self, store: RemoteStore, url: str, fingerprint: str, dtype: str, block_shape: list[int],
                 stats: KVStats, costs: TierCosts | None = None, queue_bytes: int = 256 << 20):
        self.store, self.url = store, redacted(url)
        self.fingerprint, self.dtype, self.block_shape = fingerprint, dtype, list(block_shape)
        self.ns = namespace(fingerprint, dtype, block_shape)
        self.stats, self.costs = stats, costs
        self._lock = threading.Lock()  # the health state and the counters both threads touch
        self._up = True
        self._retry_at = 0.0
        self._backoff = RETRY_S
        # queued writes (the block's raw bytes, encoded by the writer: the checksum is off the step path),
        # readable before they land
        self._pending: dict[int, memoryview] = {}
        # h -> what signals its bytes are there (a CUDA event after a device copy that did not block the step)
        self._ready: dict[int, Ready] = {}
        # bounded in bytes, not blocks: a long prompt commits hundreds of blocks at once, a few MiB each on
        # a large model; past the bound a write is dropped (counted) and offered again at eviction
        self.queue_bytes = queue_bytes
        self._pending_bytes = 0
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        stats.remote_connected = 1
        self._writer = threading.Thread(target=self._write_loop, name="kv-remote-writer", daemon=True)
        self._writer.start()
        log.info("remote KV tier: %s, namespace %s", self.url, self.ns)

    @property
    def up(self) -> bool:
        return self._up

    # ---- reads (the step's thread) ---------------------------------------------------------------
    def contains(self, hashes: Sequence[int]) -> list[bool]:
        """Which of these blocks the store (or the write queue) holds; all False while the store is down."""
        if not hashes or not self._up:
            return [False] * len(hashes)
        try:
            found = self.store.contains_many([block_key(self.ns, h) for h in hashes])
        except RemoteStoreError as e:
            self._failed("lookup", e)
            return [False] * len(hashes)
        with self._lock:
            pending = self._pending
            return [f or h in pending for h, f in zip(hashes, found, strict=True)]

    def fetch(self, hashes: Sequence[int]) -> dict[int, memoryview]:
        """The checked payloads of these blocks that the store holds (one round trip per few blocks); a
        missing, corrupt, truncated or foreign value is left out."""
        out: dict[int, memoryview] = {}
        with self._lock:
            for h in hashes:
                if h in self._pending:
                    self._wait(h)
                    out[h] = self._pending[h]  # not landed yet: no link time to measure
        ask = [h for h in hashes if h not in out]
        if not ask or not self._up:
            return out
        start = time.perf_counter()
        try:
            values = self.store.get_many([block_key(self.ns, h) for h in ask])
        except RemoteStoreError as e:
            self._observe(len(ask), time.perf_counter() - start)
            self._failed("read", e)
            return out
        nbytes = bad = 0
        for h, value in zip(ask, values, strict=True):
            if value is None:
                continue
            nbytes += len(value)
            payload = self._payload(h, value)
            if payload is None:
                bad += 1
            else:
                out[h] = payload
        # a load's price includes the checks, as the disk tier's does (a write's: the checksum and the link)
        self._observe(len(ask), time.perf_counter() - start)
        with self._lock:
            self.stats.remote_bytes_read += nbytes
            self.stats.remote_bad_values += bad
        return out

    def _payload(self, h: int, value: bytes) -> memoryview | None:
        try:
            # writable: torch reads the payload in place (and warns on read-only buffers)
            return fmt.decode(memoryview(bytearray(value)), h, self.fingerprint, self.dtype, self.block_shape)
        except fmt.BadBlockFile:
            return None

    # ---- writes ----------------------------------------------------------------------------------
    def put(self, h: int, payload: memoryview, ready: Ready | None = None) -> bool:
        """Queues a write of one block's bytes (a copy the caller no longer touches, complete once `ready`
        synchronizes, where given); False, counted, when the store is down or the queued writes hold
        queue_bytes already."""
        with self._lock:
            full = self._pending_bytes + payload.nbytes > self.queue_bytes
            if not self._up or self._closed or full or h in self._pending:
                self.stats.remote_writes_dropped += h not in self._pending
                return False
            self._pending[h] = payload
            self._pending_bytes += payload.nbytes
            if ready is not None:
                self._ready[h] = ready
        self._queue.put(h)
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Waits (at most timeout seconds) for the queued writes to be sent or dropped."""
        q = self._queue
        with q.all_tasks_done:
            return q.all_tasks_done.wait_for(lambda: not q.unfinished_tasks, timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        self._writer.join()
        self.store.close()

    def _write_loop(self) -> None:
        self._try_store()  # a store that is not there at start-up: one log line now, not at the first write
        while True:
            wait = None if self._up else max(0.0, self._retry_at - time.monotonic())
            try:
                batch = [self._queue.get(timeout=wait)]
            except queue.Empty:
                self._try_store()
                continue
            while len(batch) < WRITE_BATCH and batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            hashes = [h for h in batch if isinstance(h, int)]
            try:
                if hashes:
                    self._write(hashes)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if batch[-1] is None:
                return

    def _write(self, hashes: list[int]) -> None:
        with self._lock:
            items = [(h, v) for h in hashes if (v := self._pending.get(h)) is not None]
        for h, _ in items:
            self._wait(h)
        if not self._up and time.monotonic() >= self._retry_at:
            self._try_store()
        sent = False
        if self._up and items:
            start = time.perf_counter()
            try:
                self.store.put_many([(block_key(self.ns, h), self._encode(h, v)) for h, v in items])
                sent = True
            except RemoteStoreError as e:
                self._failed("write", e)
            self._observe(len(items), time.perf_counter() - start)
        with self._lock:
            for h, v in items:
                if self._pending.get(h) is v:
                    del self._pending[h]
                    self._ready.pop(h, None)
                    self._pending_bytes -= v.nbytes
            if sent:
                self.stats.remote_writes += len(items)
                self.stats.remote_bytes_written += sum(v.nbytes for _, v in items)
            else:
                self.stats.remote_writes_dropped += len(items)

    def _wait(self, h: int) -> None:
        ready = self._ready.get(h)
        if ready is not None:
            ready.synchronize()

    def _encode(self, h: int, payload: memoryview) -> bytes:
        return fmt.encode_header(h, self.fingerprint, self.dtype, self.block_shape, payload) + payload

    # ---- health ----------------------------------------------------------------------------------
    def _try_store(self) -> None:
        try:
            self.store.ping()
        except RemoteStoreError as e:
            self._failed("ping", e)
            return
        with self._lock:
            was_up, self._up, self._backoff = self._up, True, RETRY_S
            self.stats.remote_connected = 1
        if not was_up:
            log.warning("remote KV store %s answers again: remote tier back", self.url)

    def _failed(self, what: str, error: Exception) -> None:
        with self._lock:
            was_up = self._up
            if not was_up:
                self._backoff = min(2 * self._backoff, MAX_RETRY_S)
            self._up = False
            self._retry_at = time.monotonic() + self._backoff
            self.stats.remote_errors += 1
            self.stats.remote_connected = 0
        if was_up:
            self._queue.put(_WAKE)
            log.warning("remote KV store %s failed (%s: %s): remote tier reads are misses and writes are "
                        "dropped until it answers (retried in the background)", self.url, what, error)

    def _observe(self, blocks: int, seconds: float) -> None:
        if self.costs is not None and blocks:
            self.costs.observe_load("remote", blocks, seconds)
