"""Scheduler settings and the request-rejection error (pure Python).

`mode` names the scheduling policy (policy.py): `static` (static.py), or continuous batching whose
co-design policies (cache-aware admission, prefix grouping) switch on in `codesign`. `auto` follows the KV
manager's mode, so a KVConfig(mode=...) alone picks continuous / continuous+lru / codesign."""

from __future__ import annotations

from dataclasses import dataclass

from kvloop.engine.core import defaults as D
from kvloop.engine.core.cascade_scope import SCOPES
from kvloop.engine.core.config_options import option
from kvloop.engine.core.policy import AUTO, get_policy, scheduler_modes
from kvloop.engine.core.slo import Slo

STATIC_OOM = ("fail", "retry")
CASCADE_GROUPS = ("auto", *SCOPES)
SPECULATION_MODES = ("auto", "ngram", "off")  # speculation.py's MODES (kept here: the config's layer)
QUEUE_ORDERS = ("arrival", "work", "slo")  # codesign's waiting-queue order (grouping.py, ordering.py)


def resolve_cascade_groups(setting: str, mode: str) -> str:
    """Which shared prefixes decode steps may cascade: the setting, or under auto the scope the policy
    named `mode` gives (Policy.cascade_groups)."""
    if setting != "auto":
        return setting
    return get_policy(mode).cascade_groups


@dataclass
class SchedulerConfig:
    # the configured values of the live knobs (core/knobs.py): where they start, and the budget's ceiling
    max_num_seqs: int = option(D.BATCH_CAP, flag="--max-num-seqs", setting="scheduler.max_num_seqs",
                               help="batch cap: running requests at most (the feedback loop moves it live)")
    max_num_batched_tokens: int = option(D.STEP_TOKEN_BUDGET, flag="--max-num-batched-tokens",
                                         setting="scheduler.max_num_batched_tokens",
                                         help="token budget of one step (the feedback loop moves it live, "
                                              "never above this)")
    max_model_len: int = option(D.MAX_MODEL_LEN, flag="--max-model-len", setting="max_model_len",
                                help="longest sequence (prompt + output) in tokens")
    tpot_target_ms: float | None = option(None, flag="--tpot-target-ms", setting="scheduler.tpot_target_ms",
                                          help="time per output token to hold: while the smoothed decode "
                                               "step is slower, waiting requests wait (default: no target)")
    # the SLO each finished request is counted against (core/slo.py; the coordinator steers on the counts)
    slo_ttft_s: float = option(D.SLO_TTFT_BASE_S, flag="--slo-ttft-s", setting="slo.ttft_s",
                               help="SLO: time to first token allowed to every request, seconds")
    slo_ttft_per_1k_s: float = option(D.SLO_TTFT_PER_1K_S, flag="--slo-ttft-per-1k-s",
                                      setting="slo.ttft_per_1k_prompt_tokens_s",
                                      help="SLO: TTFT allowed on top per 1,000 prompt tokens, seconds")
    slo_tpot_s: float = option(D.SLO_TPOT_S, flag="--slo-tpot-s", setting="slo.tpot_s",
                               help="SLO: mean time per output token allowed, seconds")
    # a prefill-only step has no decode latency to protect: a 2,000-token prompt on an idle engine in one
    # step, not four (vLLM's CPU server budget is 2,048 for every step). Static batching keeps its own steps
    idle_step_tokens: int = option(2048, flag="--idle-step-tokens",
                                   help="token budget of a step in which no running request decodes, where "
                                        "larger than the step budget (0: the step budget in every step)")
    mode: str = AUTO  # a policy's name (policy.py), or AUTO: the KV manager's
    max_waiting: int = 1024  # bounded waiting queue: add() beyond it rejects with reason 'queue_full'
    # codesign admission: decode growth (tokens) kept free ahead of every admitted sequence
    decode_reserve_tokens: int = 64
    # codesign grouping under queue_order arrival: a request waiting this long goes first (FCFS among the
    # aged); above grouping_max_queue waiting requests the order is plain FCFS (overload: fairness and O(1)
    # per step). Under queue_order work or slo, grouping_max_queue bounds the requests ordered (peeked) per
    # step
    aging_s: float = 5.0
    grouping_max_queue: int = 64
    # codesign's waiting queue (ordering.py): arrival (prefix grouping, fixed aging_s) or work (remaining
    # uncached prefill tokens, shortest first, aged past aging_factor x the median recent queue wait). The
    # FCFS policies (continuous, continuous+lru) stay the arrival-order baselines: they ignore it. work is the
    # default: in the H200 simulator's matrix (bench/results/matrix_h200.json) it gave codesign 1.11x arrival
    # order's goodput on W1-gpu and 1.02x on W5-gpu at 1.5x continuous+lru's capacity, 1.00-1.01x at the
    # other loads and on the Mooncake trace, never below 0.997x
    queue_order: str = option("work", flag="--queue-order", setting="scheduler.queue_order",
                              choices=QUEUE_ORDERS,
                              help="codesign's waiting-queue order: arrival (prefix grouping with fixed "
                                   "aging), work (fewest uncached prompt tokens first, aging bound) or slo "
                                   "(earliest TTFT deadline under the SLO first, aging bound)")
    # 2: a queue's waits are near exponential, which pass twice their median one time in four, so the bound
    # leaves shortest-first free for most requests and catches those it keeps passing over. In the simulator
    # (W1-gpu at 160 req/s, overload) 2 gave codesign 1.18x arrival order's goodput at 1.23x its TTFT P99;
    # 1.5: 1.11x at 1.19x; 1: none
    aging_factor: float = option(2.0, flag="--aging-factor", setting="scheduler.aging_factor",
                                 help="queue_order work or slo: a request that waited this multiple of the "
                                      "median recent queue wait goes first, in arrival order")
    # 0.5 s: a quarter of the CPU SLO's 2 s TTFT base and half the GPU's 1 s, so a request passed over on a
    # lightly loaded engine (median wait near 0) still starts with most of its TTFT allowance left, yet
    # several steps long (CPU steps are 0.05-0.3 s), so a one-step wait does not age every request at once
    aging_floor_s: float = option(0.5, flag="--aging-floor-s", setting="scheduler.aging_floor_s",
                                  help="queue_order work or slo: the aging bound never falls below this many "
                                       "seconds")
    # prompt-lookup speculation (speculation.py): proposals from the request's own tokens, verified in the
    # step; off by default until measured (see speculation.py's auto rule)
    speculation: str = option(D.SPECULATION, flag="--speculation", setting="speculation",
                              choices=SPECULATION_MODES,
                              help="prompt-lookup (n-gram) speculative decoding: auto (only where the step "
                                   "cost model says it pays: a small step, nothing waiting), ngram (propose "
                                   "whenever the request's own tokens repeat) or off")
    speculation_max_tokens: int = option(D.SPECULATION_MAX_TOKENS, flag="--speculation-max-tokens",
                                         setting="speculation_max_tokens",
                                         help="proposed tokens per request and step at most (the "
                                              "coordinator may lower it live)")
    # decode cascade scope (resolve_cascade_groups): auto | nested | common
    cascade_groups: str = "auto"
    # codesign batch cap: the cap counts plain rows; requests joining a running group's shared prefix may
    # run beyond it while the step's priced attention stays within what the cap's plain rows would cost,
    # up to this factor times the cap (1: the cap is a hard row count)
    cascade_cap_factor: float = 2.0
    # static mode: fixed batches, filled for up to the timeout, prompt + max_tokens reserved up front
    static_batch_size: int = 16
    static_fill_timeout_s: float = 0.5
    # a reservation that does not fit: fail the request ('error') or retry next batch
    static_oom: str = "fail"

    @property
    def slo(self) -> Slo:
        return Slo(self.slo_ttft_s, self.slo_ttft_per_1k_s, self.slo_tpot_s)

    def __post_init__(self) -> None:
        self.slo  # noqa: B018 -- validates the SLO's values
        if self.idle_step_tokens < 0:
            raise ValueError("idle_step_tokens must be >= 0 (0: the budget in every step)")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.mode not in scheduler_modes():
            raise ValueError(f"scheduler mode must be one of {scheduler_modes()}")
        if self.cascade_groups not in CASCADE_GROUPS:
            raise ValueError(f"cascade_groups must be one of {CASCADE_GROUPS}")
        if self.tpot_target_ms is not None and self.tpot_target_ms <= 0:
            raise ValueError("tpot_target_ms must be > 0 (or unset)")
        if self.cascade_cap_factor < 1:
            raise ValueError("cascade_cap_factor must be >= 1")
        if self.static_oom not in STATIC_OOM:
            raise ValueError(f"static_oom must be one of {STATIC_OOM}")
        if min(self.max_waiting, self.static_batch_size, self.grouping_max_queue) < 1:
            raise ValueError("max_waiting, static_batch_size and grouping_max_queue must be >= 1")
        if min(self.decode_reserve_tokens, self.aging_s, self.static_fill_timeout_s, self.aging_factor,
               self.aging_floor_s) < 0:
            raise ValueError("decode_reserve_tokens, aging_s, static_fill_timeout_s, aging_factor and "
                             "aging_floor_s must be >= 0")
        if self.speculation not in SPECULATION_MODES:
            raise ValueError(f"speculation must be one of {SPECULATION_MODES}")
        if self.speculation_max_tokens < 0:
            raise ValueError("speculation_max_tokens must be >= 0")
        if self.queue_order not in QUEUE_ORDERS:
            raise ValueError(f"queue_order must be one of {QUEUE_ORDERS}")


class RequestRejected(ValueError):
    """The request is refused before it runs; `reason` says why ('queue_full' maps to HTTP 429)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
