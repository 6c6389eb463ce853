"""A KV events subscriber for tests: a real ZeroMQ SUB socket and vLLM's replay protocol, decoding the
batches with msgspec into structures of vLLM's shape, and mirroring what a router would believe a pod
holds."""

from __future__ import annotations

import time

import msgspec
import zmq

from kvloop.engine.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

END_SEQ = -1
_TYPES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


class _Decoder:
    """A batch in either encoding (events as tagged maps or as arrays) into vLLM-shaped structs."""

    def __init__(self):
        self.arrays = msgspec.msgpack.Decoder(KVEventBatch)

    def decode(self, payload: bytes) -> KVEventBatch:
        plain = msgspec.msgpack.decode(payload)
        if not plain[1] or isinstance(plain[1][0], list):
            return self.arrays.decode(payload)
        for e in plain[1]:
            e.pop("lora_name", None)  # vLLM's later field, written nil for vllm-router; no adapters here
        events = [_TYPES[e.pop("type")](**e) for e in plain[1]]
        return KVEventBatch(plain[0], events, *plain[2:])


class Subscriber:
    def __init__(self, endpoint: str, topic: str, replay_endpoint: str | None = None):
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.topic = topic.encode()
        self.replay_endpoint = replay_endpoint
        self.batches: dict[int, KVEventBatch] = {}  # sequence number -> batch
        self.decoder = _Decoder()

    def close(self) -> None:
        self.sub.close()

    def poll(self, timeout_s: float) -> int:
        """Receives what arrives within timeout_s (returns at the first quiet 100 ms after something came)."""
        got, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.sub.poll(100):
                if got:
                    return got
                continue
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == self.topic
            self.batches[int.from_bytes(seq, "big")] = self.decoder.decode(payload)
            got += 1
        return got

    def replay(self, start: int = 0) -> None:
        """vLLM's replay: a DEALER asks the ROUTER for every buffered batch from `start` on."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                assert dealer.poll(5000), "no replay answer"
                _, seq_bytes, payload = dealer.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_SEQ:
                    return
                self.batches[seq] = self.decoder.decode(payload)
        finally:
            dealer.close()

    def in_order(self) -> list[KVEventBatch]:
        seqs = sorted(self.batches)
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"a gap in the sequence numbers: {seqs}"
        return [self.batches[s] for s in seqs]

    def events(self) -> list:
        return [e for b in self.in_order() for e in b.events]


def mirror(events: list) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """What a router believes the pod holds: hash -> (parent hash, the block's token ids)."""
    held: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for e in events:
        if isinstance(e, BlockStored):
            parent, bs = e.parent_block_hash, e.block_size
            assert len(e.token_ids) == bs * len(e.block_hashes)
            for i, h in enumerate(e.block_hashes):
                assert parent is None or parent in held, "stored under a parent the router never saw"
                held[h] = (parent, tuple(e.token_ids[i * bs : (i + 1) * bs]))
                parent = h
        elif isinstance(e, BlockRemoved):
            for h in e.block_hashes:
                held.pop(h, None)
        elif isinstance(e, AllBlocksCleared):
            held.clear()
    return held
