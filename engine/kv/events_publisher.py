"""Publishes the device prefix index's KV events over ZeroMQ in vLLM's format (kv/kv_events.py says which),
from a thread of its own, off the step's path.

`KVEventPublisher.attach(manager, endpoint, topic)` wires a KVEventLog into the manager and starts the
thread, in whichever process holds the KV manager (the API process with the thread backend, the engine
core process with the process backend: EngineCore builds both). The thread wakes every `interval_s`,
drains what the engine recorded since, and sends it as one KVEventBatch: [topic, sequence number (8 bytes,
big-endian, from 0), msgpack payload] on a PUB socket, bound when the endpoint has a wildcard (tcp://*:5557)
or is ipc:// or inproc://, else connected (vLLM's rule). Consecutive stores of one chain go out as one
BlockStored (their hashes and token ids in order), consecutive removals as one BlockRemoved. The first batch
is an all-cleared event: a router that knew this endpoint before a restart forgets the old cache. With a
replay endpoint, a ROUTER socket answers vLLM's replay requests from the last `replay_batches` batches."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq

from kvloop.engine.kv.event_hashes import KvloopHashes, WireHashes, make_wire_hashes
from kvloop.engine.kv.event_log import CLEARED, REMOVED, STORED, KVEventLog, unpack_ids
from kvloop.engine.kv.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    as_encoded,
    encoder,
    expanded_topic,
)

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker (vLLM's)
DEFAULT_INTERVAL_S = 0.01
DEFAULT_REPLAY_BATCHES = 10_000  # vLLM's buffer_steps
SEND_HWM = 100_000  # vLLM's PUB high-water mark


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard or a local transport is bound, anything else connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def to_events(raw: list[tuple], block_size: int, hashes: WireHashes | None = None,
              ) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    """The log's tuples as vLLM's events (hashes as `hashes` publishes them: kv/event_hashes.py), runs of one
    chain's stores and of removals merged."""
    hashes = hashes or KvloopHashes()
    out: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    last_stored = None  # kvloop key of the last block of the BlockStored at out[-1], when it is one
    for event in raw:
        kind = event[0]
        if kind == STORED:
            _, h, parent, packed = event
            ids = unpack_ids(packed)
            wire = hashes.stored(h, parent, ids)
            if wire is None:
                last_stored = None
                continue
            tail = out[-1] if out else None
            if isinstance(tail, BlockStored) and parent == last_stored:
                tail.block_hashes.append(wire[0])
                tail.token_ids += ids
            else:
                out.append(BlockStored([wire[0]], wire[1], ids, block_size, None, MEDIUM_GPU))
            last_stored = h
            continue
        last_stored = None
        if kind == REMOVED:
            gone = hashes.removed(event[1])
            if gone is None:
                continue
            tail = out[-1] if out else None
            if isinstance(tail, BlockRemoved):
                tail.block_hashes.append(gone)
            else:
                out.append(BlockRemoved([gone], MEDIUM_GPU))
        elif kind == CLEARED:
            hashes.cleared()
            out.append(AllBlocksCleared())
    return out


class KVEventPublisher:
    def __init__(self, events: KVEventLog, block_size: int, endpoint: str, topic: str = "",
                 replay_endpoint: str = "", interval_s: float = DEFAULT_INTERVAL_S,
                 replay_batches: int = DEFAULT_REPLAY_BATCHES, hash_kind: str = "kvloop",
                 hash_seed: str = "", encoding: str = "map"):
        self.events = events
        self.encoding = encoding
        as_encoded(KVEventBatch(0.0, []), encoding)  # an unknown encoding raises here, before any socket
        self.block_size = block_size
        self.hashes = make_wire_hashes(hash_kind, hash_seed)  # raises on an unknown kind, before any socket
        self.topic = expanded_topic(topic).encode()
        self.interval_s = interval_s
        self.next_seq = 0
        self.batches_sent = 0
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=replay_batches)
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(SEND_HWM)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            (self._pub.bind if binds(endpoint) else self._pub.connect)(endpoint)
        except zmq.ZMQError as exc:
            self._pub.close()
            raise ValueError(f"kv events endpoint {endpoint!r}: {exc}") from exc
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            try:
                self._replay.bind(replay_endpoint)
            except zmq.ZMQError as exc:
                self._pub.close()
                self._replay.close()
                raise ValueError(f"kv events replay endpoint {replay_endpoint!r}: {exc}") from exc
        self._encode = encoder().encode
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.events.cleared()  # the first batch: forget whatever this endpoint held before a restart
        self._thread = threading.Thread(target=self._run, name="kvloop-kv-events", daemon=True)
        self._thread.start()

    @classmethod
    def attach(cls, manager, endpoint: str, topic: str = "", replay_endpoint: str = "",
               **kw) -> KVEventPublisher:
        """Records `manager`'s device index changes and publishes them (before its first request)."""
        events = KVEventLog()
        manager.attach_events(events)
        publisher = cls(events, manager.block_size, endpoint, topic, replay_endpoint, **kw)
        log.info("KV events: publishing on %s (topic %r)%s", endpoint, publisher.topic.decode(),
                 f", replay on {replay_endpoint}" if replay_endpoint else "")
        return publisher

    @property
    def dropped(self) -> int:
        return self.events.dropped

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(self.interval_s)
            try:
                self._serve_replays()
                self.publish_pending()
            except Exception:  # a broken send must not end the thread: the engine keeps serving
                log.exception("KV events: publishing failed")
            if stopping:
                return

    def publish_pending(self) -> None:
        """Sends what the engine recorded since the last call as one batch (the thread's turn; tests call it
        too: the lock keeps drains, hashes and sequence numbers in one order)."""
        with self._lock:
            raw = self.events.drain()
            if not raw:
                return
            batch = KVEventBatch(time.time(), to_events(raw, self.block_size, self.hashes))
            payload = self._encode(as_encoded(batch, self.encoding))
            seq = self.next_seq
            self.next_seq += 1
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            self._replay_buffer.append((seq, payload))
            self.batches_sent += 1

    def _serve_replays(self) -> None:
        replay = self._replay
        while replay is not None and replay.poll(0):
            with self._lock:  # the buffer is appended to under it
                self._answer_replay(replay)

    def _answer_replay(self, replay) -> None:
        """One request: every buffered batch from the asked sequence number on, then the end marker."""
        frames = replay.recv_multipart()
        if len(frames) != 3:
            log.warning("KV events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._replay_buffer:
            if seq >= first:
                replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", END_SEQ, b""))

    def close(self) -> None:
        """Publishes what is pending, stops the thread and closes the sockets."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
