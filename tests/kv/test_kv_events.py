"""KV events in vLLM's format (engine/kv/events_publisher.py): a real SUB socket decodes the batches, and
its mirror of stored minus removed blocks must be the engine's device prefix index, with each block's
parent and token ids."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from kv_events_sub import Subscriber, mirror
from kv_helpers import greedy, run, tokens

from kvloop.engine.kv.events_publisher import to_events
from kvloop.engine.kv.hashing import ROOT
from kvloop.engine.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, wire_hash

TOPIC = "kv@pod-a@smol"
_count = itertools.count()


@pytest.fixture
def evented(make_engine, tmp_path):
    """make(**kv) -> (engine publishing on ipc sockets under tmp_path, a subscriber connected to them)."""
    made = []

    def make(**kv):
        n = next(_count)
        pub, replay = f"ipc://{tmp_path}/ev{n}", f"ipc://{tmp_path}/replay{n}"
        engine = make_engine(kv_events_endpoint=pub, kv_events_topic=TOPIC, kv_events_replay_endpoint=replay,
                             **kv)
        sub = Subscriber(pub, TOPIC, replay)
        made.append((engine, sub))
        return engine, sub

    yield make
    for engine, sub in made:
        sub.close()
        engine.kv.events_publisher.close()


def settle(engine, sub: Subscriber) -> list:
    """Everything the engine published so far, as the subscriber sees it: what it missed while joining
    (a PUB socket drops messages sent before a subscription arrives) is replayed, as vLLM's protocol does."""
    engine.kv.events_publisher.publish_pending()  # not waiting for the thread's next turn
    sub.poll(2.0)
    sub.replay(0)
    return sub.events()


def index_view(engine) -> dict[int, tuple[int | None, tuple[int, ...]]]:
    """The engine's device prefix index in the mirror's terms (hashes as on the wire)."""
    index, out = engine.kv.index, {}
    for h, parent in index.entries().values():
        out[wire_hash(h)] = (None if parent == ROOT else wire_hash(parent), None)
    return out


def test_stored_events_name_the_indexed_blocks(evented):
    engine, sub = evented()
    ids = tokens(1, 70)
    _, seq = run(engine, "a", ids, n=12)
    events = settle(engine, sub)
    assert isinstance(events[0], AllBlocksCleared)  # a start forgets what the endpoint held before
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored and not any(isinstance(e, BlockRemoved) for e in events)
    held = mirror(events)
    assert {h: p for h, (p, _) in held.items()} == {h: p for h, (p, _) in index_view(engine).items()}
    # the chain in order: each block's tokens are the sequence's, its parent the block before
    bs = engine.kv.block_size
    keys = engine.kv._hasher(seq.token_ids)[: len(held)]
    assert len(held) == (len(ids) + 12 - 1) // bs  # every computed full block, output blocks too
    for i, h in enumerate(keys):
        parent, block_ids = held[wire_hash(h)]
        assert block_ids == tuple(seq.token_ids[i * bs : (i + 1) * bs])
        assert parent == (None if i == 0 else wire_hash(keys[i - 1]))
    assert all(e.block_size == bs and e.medium == "GPU" and e.lora_id is None for e in stored)


def test_evictions_are_removed_events_and_the_mirror_matches(evented):
    # 8 blocks: each request evicts the last one's; events as arrays (llm-d's form) here
    engine, sub = evented(kv_cache_tokens=8 * 16, kv_events_encoding="array")
    for i in range(4):
        run(engine, f"r{i}", tokens(10 + i, 60), n=4)
    run(engine, "again", tokens(10, 60), n=4)  # a prefix hit on what is still cached, then more evictions
    events = settle(engine, sub)
    assert any(isinstance(e, BlockRemoved) for e in events)
    assert engine.kv.stats.evictions > 0
    held = mirror(events)
    assert set(held) == set(index_view(engine))
    assert all(p == index_view(engine)[h][0] for h, (p, _) in held.items())


def test_reset_is_all_cleared(evented):
    engine, sub = evented()
    run(engine, "a", tokens(3, 50), n=4)
    assert engine.kv.num_cached_blocks > 0
    assert engine.kv.reset_prefix_cache()
    events = settle(engine, sub)
    assert isinstance(events[-1], AllBlocksCleared)
    assert mirror(events) == {} and len(engine.kv.index) == 0
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    engine.kv.check_integrity([])
    # the cache works after a reset, and the router learns it again
    run(engine, "b", tokens(3, 50), n=4)
    assert set(mirror(settle(engine, sub))) == set(index_view(engine)) != set()


def test_reset_refused_while_blocks_are_held(make_engine):
    engine = make_engine()
    engine.add_request("held", tokens(4, 40), greedy(8))
    engine.step()
    assert not engine.kv.reset_prefix_cache()
    engine.drain(max_steps=100)


def test_events_off_costs_no_socket(make_engine):
    engine = make_engine()
    assert engine.kv.events_publisher is None and engine.kv.index.events is None


def test_array_encoding_is_vllm_array_like():
    """A batch is [ts, [events]]; an event is [tag, fields...] with trailing defaults left out, as vLLM's
    array_like msgspec structs and llm-d's decoder (an array led by the tag string) read them."""
    raw = [("stored", 5, ROOT, bytes(8 * 2)), ("stored", 6, 5, bytes(8 * 2)), ("removed", 5), ("cleared",)]
    batch = KVEventBatch(1.5, to_events(raw, 2))
    plain = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert plain == [1.5, [["BlockStored", [5, 6], None, [0, 0, 0, 0], 2, None, "GPU"],
                           ["BlockRemoved", [5], "GPU"], ["AllBlocksCleared"]], 0]


def llm_d_keys(ids: list[int], block_size: int, seed: str) -> list[int]:
    """The keys llm-d's precise prefix scorer computes from a prompt (its token_processor.go, restated):
    the low 64 bits, big-endian, of SHA-256 over canonical CBOR; the root from the seed string."""
    import hashlib

    import cbor2

    def u64(value) -> int:
        return int.from_bytes(hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()[24:], "big")

    keys, parent = [], u64(seed)
    for i in range(len(ids) // block_size):
        parent = u64([parent, ids[i * block_size : (i + 1) * block_size], None])
        keys.append(parent)
    return keys


def test_vllm_hashes_are_what_llm_d_computes_from_the_prompt(evented):
    engine, sub = evented(kv_cache_tokens=8 * 16, kv_events_hash="vllm_sha256_cbor_64bit",
                          kv_events_hash_seed="1234")
    seqs = [run(engine, f"r{i}", tokens(20 + i, 60), n=4)[1] for i in range(3)]  # evictions on the way
    events = settle(engine, sub)
    assert any(isinstance(e, BlockRemoved) for e in events)
    held = mirror(events)
    bs = engine.kv.block_size
    expected = {}
    for seq in seqs:
        keys = llm_d_keys(seq.token_ids, bs, "1234")
        for i, h in enumerate(engine.kv._hasher(seq.token_ids)):
            if h in engine.kv.index.slots:
                expected[keys[i]] = (None if i == 0 else keys[i - 1],
                                     tuple(seq.token_ids[i * bs : (i + 1) * bs]))
    assert held == expected and held


def test_map_encoding_is_an_array_of_tagged_maps():
    """--kv-events-encoding map (the default): the batch [ts, events, rank], each event a map tagged by
    "type" (vllm-router's decoder, Dynamo's documented form); every field written (lora_id and lora_name
    as nil): vllm-router 0.1.17 refuses a BlockStored without them."""
    from kvloop.engine.kv.kv_events import as_encoded

    raw = [("stored", 5, ROOT, bytes(8 * 2)), ("removed", 5), ("cleared",)]
    batch = KVEventBatch(2.5, to_events(raw, 2))
    plain = msgspec.msgpack.decode(msgspec.msgpack.encode(as_encoded(batch, "map")))
    assert plain == [2.5, [{"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None,
                            "token_ids": [0, 0], "block_size": 2, "lora_id": None, "medium": "GPU",
                            "lora_name": None},
                           {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"},
                           {"type": "AllBlocksCleared"}], 0]
    with pytest.raises(ValueError, match="encoding"):
        as_encoded(batch, "json")


def test_wire_hashes_fit_signed_and_unsigned_readers():
    assert wire_hash((1 << 128) - 1) == (1 << 63) - 1  # non-negative, below 2**63


def test_a_full_buffer_drops_counted_and_clears_the_routers_view():
    from kvloop.engine.kv.event_log import KVEventLog, TokenRecordingHasher

    hasher = TokenRecordingHasher(2, b"", capacity=4)
    keys = hasher(list(range(8)))
    log = KVEventLog(hasher, capacity=2)
    log.stored(keys[0], ROOT)
    log.stored(keys[1], keys[0])
    log.stored(keys[2], keys[1])  # dropped: the buffer holds two
    assert log.dropped == 1
    events = to_events(log.drain(), 2)
    assert [type(e) for e in events] == [BlockStored, AllBlocksCleared]  # what came before, then a clear
    assert events[0].token_ids == [0, 1, 2, 3]
    assert log.drain() == []  # the clear is sent once


def test_drops_count_in_the_managers_stats_and_prometheus(evented):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvloop.engine.server.metrics import EngineMetrics

    engine, _ = evented()
    log = engine.kv.index.events
    assert log.stats is engine.kv.stats
    log.capacity = 0  # every event from here on is dropped
    run(engine, "dropped", tokens(5, 40), 2)
    assert log.dropped == engine.kv.stats.kv_events_dropped > 0
    text = generate_latest(EngineMetrics("m", engine.snapshot).registry).decode()
    exported = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert exported["kvloop:kv_events_dropped_total"] == log.dropped


def test_token_ids_outlive_one_generation_of_the_hasher():
    from kvloop.engine.kv.event_log import TokenRecordingHasher, unpack_ids

    hasher = TokenRecordingHasher(2, b"", capacity=4)
    first = hasher([7, 8, 9, 10])
    hasher(list(range(100, 112)))  # six more blocks: past the capacity, the next call starts a generation
    hasher([1, 2])
    assert unpack_ids(hasher.packed_ids(first[1])) == [9, 10]  # still in the previous generation


def test_the_topic_expands_environment_variables(tmp_path, monkeypatch):
    """The operator renders one topic template for every pod (kv@${POD_IP}:8000@<model>); each publisher
    sends under its own pod's address, and an unset variable stays as written."""
    from kvloop.engine.kv.event_log import KVEventLog
    from kvloop.engine.kv.events_publisher import KVEventPublisher

    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.delenv("KVLOOP_TEST_UNSET", raising=False)
    endpoint, topic = f"ipc://{tmp_path}/topic", "kv@10.1.2.3:8000@smol/${KVLOOP_TEST_UNSET}"
    publisher = KVEventPublisher(KVEventLog(), 16, endpoint, "kv@${POD_IP}:8000@smol/${KVLOOP_TEST_UNSET}",
                                 replay_endpoint=f"ipc://{tmp_path}/topic-replay")
    sub = Subscriber(endpoint, topic, f"ipc://{tmp_path}/topic-replay")
    try:
        assert publisher.topic == topic.encode()
        for _ in range(50):  # until the subscription reaches the publisher: nothing is sent to it before
            publisher.events.cleared()
            publisher.publish_pending()
            if sub.poll(0.1):  # live frames, each checked to carry the expanded topic
                break
        assert sub.events() and all(isinstance(e, AllBlocksCleared) for e in sub.events())
    finally:
        sub.close()
        publisher.close()
