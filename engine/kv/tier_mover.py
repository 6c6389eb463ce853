"""The only code that moves K/V tensors between tiers: device pool <-> host tier copies, and the disk
tier's files, written behind by a background thread through a bounded queue (a full queue drops the
write, the caller counts it; the step never waits on disk). Reads verify the file header and checksum;
a bad file is deleted and reported as a miss. The remote tier's values go through kv.remote_client (bytes,
checks, the writer thread, the store's health); here they are copied out of and into the pool. Loads into the
device (host copies, disk reads) are timed
and reported to the KV manager's TierCosts, which decides whether a lower-tier prefix is loaded or
recomputed (kv.load_or_recompute)."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import torch

from kvloop.engine.kv import disk_format as fmt
from kvloop.engine.kv.load_or_recompute import TierCosts
from kvloop.engine.kv.remote_client import RemoteKV


class TierMover:
    def __init__(self, kv_cache: torch.Tensor, host_slots: int = 0, disk_dir: str | None = None,
                 fingerprint: str = "", queue_size: int = 64, costs: TierCosts | None = None,
                 remote: RemoteKV | None = None):
        self.kv = kv_cache  # [layers, 2, blocks, block_size, kv_heads, head_dim]
        layers, two, _, bs, heads, dim = kv_cache.shape
        self.block_shape = [layers, two, bs, heads, dim]
        self.costs = costs  # where measured loads go (None: not measured)
        if costs is not None:
            costs.set_load_prior(layers * two * bs * heads * dim * kv_cache.element_size())
        self.dtype_name = str(kv_cache.dtype).removeprefix("torch.")
        self.fingerprint = fingerprint
        self.host = None
        if host_slots:
            # empty: pages are only touched when used; pinned on CUDA for fast copies
            self.host = torch.empty((layers, two, host_slots, bs, heads, dim), dtype=kv_cache.dtype,
                                    pin_memory=kv_cache.is_cuda)
        self.dir = Path(disk_dir) if disk_dir else None
        self._pending: dict[int, torch.Tensor] = {}  # queued writes, readable before they land
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._writer = None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
            self._writer.start()
        self.remote = remote
        self._fetched: dict[int, memoryview] = {}  # the remote values of the lookup under way

    @classmethod
    def for_manager(cls, kv, kv_cache: torch.Tensor, fingerprint: str) -> TierMover:
        cfg = kv.config
        mover = cls(kv_cache, kv.host.num_slots if kv.host is not None else 0,
                    cfg.disk_dir if kv.disk is not None else None,
                    fingerprint, cfg.disk_queue_size, kv.tier_costs)
        if kv.remote is not None:
            mover.remote = mover.open_remote(cfg, kv.stats, kv.tier_costs)
        return mover

    def open_remote(self, cfg, stats, costs: TierCosts | None) -> RemoteKV:
        from kvloop.engine.kv.remote_tier import PASSWORD_ENV, open_store

        store = open_store(cfg.kv_remote_url, cfg.kv_remote_timeout_ms / 1000, os.environ.get(PASSWORD_ENV),
                           cfg.remote_ttl_s)
        return RemoteKV(store, cfg.kv_remote_url, self.fingerprint, self.dtype_name, self.block_shape, stats,
                        costs, cfg.remote_queue_mib << 20)

    # ---- device <-> host ------------------------------------------------------------------------
    def device_to_host(self, block: int, slot: int) -> None:
        self.host[:, :, slot].copy_(self.kv[:, :, block])

    def host_to_device(self, slot: int, block: int) -> None:
        start = time.perf_counter()
        self.kv[:, :, block].copy_(self.host[:, :, slot])  # synchronous: the time is the copy's
        self._loaded("host", start)

    def _loaded(self, tier: str, start: float) -> None:
        if self.costs is not None:
            self.costs.observe_load(tier, 1, time.perf_counter() - start)

    # ---- disk -----------------------------------------------------------------------------------
    def disk_write(self, h: int, tier: str, index: int, timeout: float = 0.0) -> bool:
        """timeout > 0 (the shutdown flush) waits that long for room in the queue instead of dropping."""
        if timeout <= 0 and self._queue.full():
            return False
        src = (self.kv if tier == "device" else self.host)[:, :, index]
        data = torch.empty(self.block_shape, dtype=self.kv.dtype).copy_(src)
        with self._lock:
            self._pending[h] = data
        try:
            self._queue.put((h, data), timeout=timeout) if timeout > 0 else self._queue.put_nowait((h, data))
        except queue.Full:
            with self._lock:
                self._pending.pop(h, None)
            return False
        return True

    def disk_read(self, h: int, block: int) -> bool:
        with self._lock:
            data = self._pending.get(h)
        if data is not None:  # not written yet: a memory copy, not what a disk load costs
            self.kv[:, :, block].copy_(data)
            return True
        start = time.perf_counter()
        path = self.dir / fmt.file_name(h)
        try:
            with open(path, "rb") as f:
                buf = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(buf)
            payload = fmt.decode(memoryview(buf), h, self.fingerprint, self.dtype_name, self.block_shape)
            tensor = torch.frombuffer(payload, dtype=torch.uint8).view(self.kv.dtype).view(self.block_shape)
            self.kv[:, :, block].copy_(tensor)
            self._loaded("disk", start)
            return True
        except (OSError, fmt.BadBlockFile, RuntimeError):
            path.unlink(missing_ok=True)
            return False

    def disk_delete(self, h: int) -> None:
        with self._lock:
            self._pending.pop(h, None)
            (self.dir / fmt.file_name(h)).unlink(missing_ok=True)

    def disk_scan(self) -> list[int]:
        """Hashes with block files, oldest first; leftovers of interrupted writes are removed."""
        if self.dir is None:
            return []
        found = []
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".tmp"):
                Path(entry.path).unlink(missing_ok=True)
                continue
            h = fmt.parse_name(entry.name)
            if h is not None and entry.is_file():
                found.append((entry.stat().st_mtime_ns, h))
        return [h for _, h in sorted(found)]

    def disk_set_order(self, hashes: list[int]) -> None:
        """Stamps the files' mtimes in the given order, 1 µs apart, so a restart's scan rebuilds this LRU
        order (files written in prefix order would otherwise put every head before its tail)."""
        base = time.time_ns()
        for i, h in enumerate(hashes):
            try:
                os.utime(self.dir / fmt.file_name(h), ns=(base + i * 1000,) * 2)
            except OSError:
                pass  # gone or never landed: nothing to order

    # ---- remote ---------------------------------------------------------------------------------
    def remote_available(self) -> bool:
        return self.remote is not None and self.remote.up

    def remote_contains(self, hashes: list[int]) -> list[bool]:
        return self.remote.contains(hashes)

    def remote_prefetch(self, hashes: list[int]) -> None:
        self._fetched = self.remote.fetch(hashes) if hashes else {}

    def remote_read(self, h: int, block: int) -> bool:
        payload = self._fetched.pop(h, None)
        if payload is None:
            payload = self.remote.fetch([h]).get(h)
        if payload is None:
            return False
        tensor = torch.frombuffer(payload, dtype=torch.uint8).view(self.kv.dtype).view(self.block_shape)
        self.kv[:, :, block].copy_(tensor)
        return True

    def remote_write(self, h: int, tier: str, index: int) -> bool:
        if not self.remote.up:
            return False  # no copy for a write that would be dropped
        src = (self.kv if tier == "device" else self.host)[:, :, index]
        ready = None
        # on a GPU the copy runs behind the step's kernels, and the writer thread waits for it, not the step
        if src.is_cuda:
            data = torch.empty(self.block_shape, dtype=self.kv.dtype, pin_memory=True)
            data.copy_(src, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            data = torch.empty(self.block_shape, dtype=self.kv.dtype).copy_(src)
        return self.remote.put(h, memoryview(data.view(torch.uint8).numpy()).cast("B"), ready)

    def flush(self, timeout: float | None = None) -> bool:
        """Waits for the queued writes (at most timeout seconds): the disk's first, then the remote tier's in
        the time left (best effort: a write that does not land costs a peer a recomputation). True when the
        disk writes have landed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        landed = True
        if self._writer is not None:
            q = self._queue
            with q.all_tasks_done:  # Queue.join() with a timeout
                landed = q.all_tasks_done.wait_for(lambda: not q.unfinished_tasks, timeout)
        if self.remote is not None:
            self.remote.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return landed

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
        if self._writer is not None:
            self._queue.join()
            self._queue.put(None)
            self._writer.join()
            self._writer = None

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(*item)
            except OSError:
                pass  # a failed write is a later miss; the reader deletes what is left
            finally:
                self._queue.task_done()

    def _write(self, h: int, data: torch.Tensor) -> None:
        with self._lock:
            if self._pending.get(h) is not data:
                return  # deleted (evicted) before it was written
        payload = memoryview(data.view(torch.uint8).numpy()).cast("B")
        name = fmt.file_name(h)
        tmp = self.dir / f".{name}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(fmt.encode_header(h, self.fingerprint, self.dtype_name, self.block_shape, payload))
            f.write(payload)
        with self._lock:
            if self._pending.get(h) is data:
                os.replace(tmp, self.dir / name)
                del self._pending[h]
            else:
                tmp.unlink(missing_ok=True)
