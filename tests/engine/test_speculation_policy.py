"""Prompt-lookup proposals and how many a row gets (engine/scheduler/speculation.py), without a model: the
suffix match, the auto rule's cost model, yielding to waiting requests and to a full step, the slots taken
from free blocks only and given back past the accepted point, and the counters' Prometheus names."""

from __future__ import annotations

from kvloop.engine.core.batch import ScheduledBatch, ScheduledSeq
from kvloop.engine.core.knobs import Knobs
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.kv.config import KVConfig
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.scheduler.speculation import (
    Speculator,
    auto_length,
    expected_gain,
    propose,
    same_class_limit,
)
from kvloop.engine.server.metrics import SnapshotCollector


def test_propose_longest_recent_suffix():
    assert propose([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert propose([5, 1, 2, 7, 1, 2], 3) == [7, 1, 2]  # the 2-gram [1, 2] recurs
    assert propose([1, 2, 3, 4], 3) == []  # nothing recurs
    assert propose([4, 8, 4, 9, 4], 1) == [9]  # the latest earlier occurrence of [4]
    assert propose([1, 1], 0) == []


def test_auto_length_by_cost():
    # a proposal pays while rate^i of a step's time exceeds one more row's attention
    assert auto_length(0.9, 4, row_cost_us=100.0, step_us=20_000.0) == 4
    assert auto_length(0.0, 4, row_cost_us=100.0, step_us=20_000.0) == 0
    assert auto_length(0.5, 4, row_cost_us=3_000.0, step_us=20_000.0) == 2  # 0.25 * 20 ms > 3 ms > 0.125 *
    assert expected_gain(0.5, 2) == 0.75


def test_size_class_limit():
    classes = [0, 0, 1, 1, 2, 2, 2]  # sizes 1 | 2-3 | 4.. (probe of 6)
    assert same_class_limit(classes, 1) == 1 and same_class_limit(classes, 2) == 3
    assert same_class_limit(classes, 4) is None  # the last class runs past the probe


def rows(kv: KVCacheManager, n: int, tokens: list[int]) -> ScheduledBatch:
    batch = ScheduledBatch()
    for i in range(n):
        seq = Sequence(f"r{i}", list(tokens), SamplingParams(max_tokens=50))
        kv.allocate(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens - 1
        batch.decodes.append(ScheduledSeq(seq, seq.num_tokens - 1, 1))
    return batch


def test_assign_yields_and_gives_blocks_back():
    kv = KVCacheManager(8, 4, KVConfig(mode="continuous"))
    tokens = [1, 2, 3, 1, 2, 3, 1, 2]  # two full blocks: proposals need a third
    spec = Speculator("ngram", Knobs(8, 0.0, 64, speculation_max_tokens=4))
    batch = rows(kv, 1, tokens)
    spec.assign(batch, 100, kv, waiting=True, row_cost_us=lambda c: 0.0)
    item = batch.decodes[0]
    assert item.draft == [3, 1, 2] and len(item.seq.block_table) == 3  # the match runs to the end
    # one accepted (3) and a bonus: the row holds 10 tokens, 3 blocks
    item.seq.token_ids += [3, 7]
    spec.settle(item, [3, 7], kv)
    assert len(item.seq.block_table) == 3 and spec.stats.num_accepted_tokens == 1
    item.seq.token_ids[-2:] = []  # as if a step had kept none: 8 tokens, the third block past them
    spec.settle(item, [9], kv)
    assert len(item.seq.block_table) == 2 and kv.num_free_blocks == 6
    auto = Speculator("auto", Knobs(8, 0.0, 64, speculation_max_tokens=4))
    auto.observe_step(0.02)
    batch = rows(kv, 1, tokens[:6])
    auto.assign(batch, 100, kv, waiting=True, row_cost_us=lambda c: 0.0)
    assert batch.decodes[0].draft == []  # requests wait: auto yields
    auto.free_tokens = 1
    auto.assign(batch, 100, kv, waiting=False, row_cost_us=lambda c: 0.0)
    assert batch.decodes[0].draft == []  # the step is already at the size auto counts free
    auto.free_tokens = 12
    auto.assign(batch, 100, kv, waiting=False, row_cost_us=lambda c: 0.0)
    assert batch.decodes[0].draft


def test_assign_takes_free_blocks_only():
    kv = KVCacheManager(2, 4, KVConfig(mode="continuous"))
    batch = rows(kv, 1, [1, 2, 1, 2, 1, 2, 1, 2])  # holds both blocks, full
    spec = Speculator("ngram", Knobs(8, 0.0, 64, speculation_max_tokens=4))
    spec.assign(batch, 100, kv, waiting=False, row_cost_us=lambda c: 0.0)
    assert batch.decodes[0].draft == []  # no free block: no proposal, no eviction, no preemption


def test_prometheus_names():
    snap = EngineSnapshot(spec_num_drafts=3, spec_num_draft_tokens=9, spec_num_accepted_tokens=5,
                          spec_accepted_per_pos=(3, 2))
    families = {f.name: f for f in SnapshotCollector(lambda: snap, "m", {}).collect()}
    samples = {(s.name, s.labels.get("position")): s.value
               for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                            "vllm:spec_decode_num_accepted_tokens",
                            "vllm:spec_decode_num_accepted_tokens_per_pos")
               for s in families[name].samples}
    assert samples[("vllm:spec_decode_num_drafts_total", None)] == 3
    assert samples[("vllm:spec_decode_num_draft_tokens_total", None)] == 9
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", None)] == 5
    assert samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", "1")] == 2


def test_the_coordinator_caps_speculation():
    knobs = Knobs(8, 0.0, 64, speculation_max_tokens=4)
    spec = Speculator("ngram", knobs)
    knobs.set(speculation_max_tokens=9)
    assert spec.max_tokens == 4  # never past the configured value
    knobs.set(speculation_max_tokens=1)
    kv = KVCacheManager(8, 4, KVConfig(mode="continuous"))
    batch = rows(kv, 1, [1, 2, 3, 1, 2, 3, 1, 2])
    spec.assign(batch, 100, kv, waiting=False, row_cost_us=lambda c: 0.0)
    assert batch.decodes[0].draft == [3]
    knobs.set(speculation_max_tokens=0)
    assert not spec.active


def test_settings_file_and_bad_values(tmp_path):
    import pytest

    from kvloop.engine.scheduler.config import SchedulerConfig
    from kvloop.engine.settings_file import SettingsFileError, load_engine_settings

    path = tmp_path / "engine.yaml"
    path.write_text("speculation: ngram\nspeculation_max_tokens: 3\n")
    config, _ = load_engine_settings(path)
    assert (config.scheduler.speculation, config.scheduler.speculation_max_tokens) == ("ngram", 3)
    path.write_text("speculation: maybe\n")
    with pytest.raises(SettingsFileError, match="speculation must be one of"):
        load_engine_settings(path)
    with pytest.raises(ValueError, match="speculation_max_tokens must be >= 0"):
        SchedulerConfig(speculation_max_tokens=-1)
    assert SchedulerConfig().speculation == "off"  # the default until measured (core/defaults.py)


def test_a_row_that_stopped_accepting_is_tried_again():
    from kvloop.engine.scheduler.speculation import Acceptance

    a = Acceptance()
    for _ in range(20):
        a.observe(4, 0)
    assert auto_length(a.rate, 4, row_cost_us=1_000.0, step_us=20_000.0) == 0
    for _ in range(60):
        a.idle()
    assert auto_length(a.rate, 4, row_cost_us=1_000.0, step_us=20_000.0) > 0
