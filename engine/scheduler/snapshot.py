"""`build_snapshot`: the one place an EngineSnapshot is made, from a scheduler, its KV manager and the
engine-level counters, for EngineCore and the Simulator alike (pure Python, no torch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvloop.engine.core.snapshot import EngineSnapshot

if TYPE_CHECKING:
    from kvloop.engine.kv.manager import KVCacheManager
    from kvloop.engine.scheduler.scheduler import Scheduler


def build_snapshot(scheduler: Scheduler, kv: KVCacheManager, *, num_steps: int, step_failures: int = 0,
                   request_failures: Mapping[str, int] | None = None) -> EngineSnapshot:
    """The snapshot of a scheduler, its KV manager and the engine-level counters."""
    host, disk = kv.host, kv.disk
    decoding, pending = _running_phases(scheduler.running, kv.block_size)
    return EngineSnapshot(
        num_waiting=len(scheduler.waiting),
        num_running=len(scheduler.running),
        num_decoding=decoding,
        batch_cap=scheduler.batch_cap,
        step_token_budget=scheduler.step_token_budget,
        step_token_budget_max=scheduler.step_token_budget_max,
        max_model_len=scheduler.config.max_model_len,
        scheduler_mode=scheduler.mode,
        num_preemptions=scheduler.num_preemptions,
        num_preemptions_by_kind=scheduler.preemptions_by_kind,
        num_rejections=scheduler.num_rejections,
        num_oom_events=scheduler.num_oom_events,
        tpot_target_s=scheduler.tpot_gate.target_s or 0.0,
        decode_step_s=scheduler.tpot_gate.step_s or 0.0,
        tpot_holds=scheduler.tpot_gate.holds,
        requests_finished=scheduler.requests_finished,
        tokens_generated=scheduler.tokens_generated,
        slo_good=scheduler.slo_ledger.good,
        slo_missed=dict(scheduler.slo_ledger.missed),
        slo_slack_sum=scheduler.slo_ledger.slack_sum,
        slo_slack_count=scheduler.slo_ledger.slack_count,
        num_steps=num_steps,
        step_failures=step_failures,
        request_failures=dict(request_failures or {}),
        speculation=scheduler.speculator.mode,
        speculation_max_tokens=scheduler.speculator.max_tokens,
        spec_num_drafts=scheduler.speculator.stats.num_drafts,
        spec_num_draft_tokens=scheduler.speculator.stats.num_draft_tokens,
        spec_num_accepted_tokens=scheduler.speculator.stats.num_accepted_tokens,
        spec_accepted_per_pos=tuple(scheduler.speculator.stats.accepted_per_pos),
        kv_mode=kv.config.mode,
        prefix_cache=kv.config.prefix_cache,
        watermark=kv.watermark,
        kv_usage=kv.usage(),
        kv_blocks_total=kv.num_blocks,
        kv_blocks_free=kv.num_free_blocks,
        kv_blocks_pending=pending,
        block_size=kv.block_size,
        kv_cached_blocks=kv.num_cached_blocks,
        kv_host_blocks_used=host.num_used if host is not None else 0,
        kv_host_blocks_total=host.num_slots if host is not None else 0,
        kv_disk_blocks_used=len(disk) if disk is not None else 0,
        kv_disk_blocks_total=disk.capacity if disk is not None else 0,
        kv_ghost_entries=len(kv.ghost),
        kv_stats=dataclasses.replace(kv.stats),
    )


def _running_phases(running, block_size: int) -> tuple[int, int]:
    """(rows decoding, blocks the prefilling rows' prompts still need beyond what they hold). A row decodes
    once its whole prompt is computed (a row recomputing after preemption prefills again)."""
    decoding = pending = 0
    for seq in running:
        prompt = seq.num_prompt_tokens
        if seq.num_computed_tokens >= prompt:
            decoding += 1
        else:
            pending += max(0, -(-prompt // block_size) - len(seq.block_table))
    return decoding, pending
