"""Roofline step-time model: bytes over bandwidth, FLOPs over peak, each scaled by an efficiency,
plus fixed and per-sequence overheads (pure arithmetic, no torch).

Decode attention is priced apart, by the step-cost function the scheduler shares
(engine/cascade/step_cost.py: the runner's cascade plan over the rows' block tables, each group's
shared K/V read once): with coefficients measured on the CPU (cascade/cost.py), or, for a GPU
profile, derived from this roofline (`roofline_attention`: K/V bytes over bandwidth, products over peak).
Prefill chunks' context reads and attention stay in the roofline terms below."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvloop.engine.cascade.cost import AttentionCost
from kvloop.engine.cascade.step_cost import StepCost as DecodeCost
from kvloop.engine.core import defaults as D
from kvloop.engine.kv.load_or_recompute import Prices


@dataclass(frozen=True)
class ModelShape:
    """A Llama-family decoder, enough to count bytes and FLOPs."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype_bytes: int = 2  # weights (and KV unless kv_dtype_bytes says otherwise)
    tied_embeddings: bool = False
    kv_dtype_bytes: int | None = None  # KV cache element size; None: dtype_bytes (FP8 weights, bf16 KV: 2)
    # the model's context window (prompt + output): the simulator's max_model_len; default the engine's
    context: int = D.MAX_MODEL_LEN.value

    @property
    def layer_params(self) -> int:
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.ffn
        return q_o + k_v + mlp

    @property
    def matmul_params(self) -> int:
        """Weights multiplied by every token (all layers; the output head counts per sampled token)."""
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def weight_bytes_per_step(self) -> int:
        """Weights streamed once per step: every layer plus the output head (the embedding table is
        only gathered, a few rows per token, unless it is tied to the head, which is read anyway)."""
        return (self.matmul_params + self.head_params) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * (self.kv_dtype_bytes or self.dtype_bytes)


@dataclass(frozen=True)
class Hardware:
    name: str
    mem_bw: float  # bytes/s
    peak_flops: float  # FLOP/s (dense, the model's dtype)
    mem_bytes: float  # device memory
    link_bw: float = 25e9  # device <-> host copies (swap, demotion, promotion), bytes/s
    disk_bw: float = 2e9  # disk tier reads, bytes/s


@dataclass(frozen=True)
class Efficiency:
    """What the roofline leaves out: achieved shares of bandwidth and peak, and fixed costs."""

    bw: float = 0.8
    flops: float = 0.6
    step_overhead_s: float = 0.0  # launch, scheduling, sampling per step
    seq_overhead_s: float = 0.0  # per sequence in the step (metadata, sampler)
    token_overhead_s: float = 0.0  # per token computed (elementwise ops that neither term covers)
    chunk_overhead_s: float = 0.0  # per prefill chunk (a CPU engine runs each chunk's attention on its own)
    # Prefill chunks' KV reads and attention FLOPs. 0: they share the one roofline with the weights (a GPU
    # overlaps them). > 0: they run after the matmuls at these shares of bandwidth and peak (a CPU engine
    # runs attention as separate, less efficient ops; bench/sim_calibrate.py fits them).
    kv_bw: float = 0.0
    attn_flops: float = 0.0


@dataclass(frozen=True)
class StepCost:
    seconds: float
    bytes: float
    flops: float
    memory_bound: bool


def roofline_attention(model: ModelShape, hw: Hardware, eff: Efficiency) -> AttentionCost:
    """Decode attention per layer in the step-cost model's form, from the roofline (a GPU): K/V streamed at
    the achieved bandwidth, the products at the achieved peak (all query heads of a row, 2 products of
    2 FLOPs per multiply-add), every row in one fused kernel (no per-call or per-row fixed cost); a row
    in a cascade pays a merge that reads its extra partial output and log-sum-exp in fp32 and writes
    its result. A stated model, not a measurement: it leaves out the cascade kernels' extra launches."""
    bw, peak = hw.mem_bw * eff.bw, hw.peak_flops * eff.flops
    merge_bytes = 2 * model.heads * (model.head_dim + 1) * 4
    return AttentionCost(call_us=0.0, row_us=0.0, token_us=1e6 * model.kv_bytes_per_token / model.layers / bw,
                         token_row_us=1e6 * 4 * model.heads * model.head_dim / peak,
                         merge_us=1e6 * merge_bytes / bw)


class CostModel:
    def __init__(self, model: ModelShape, hw: Hardware, eff: Efficiency,
                 attention: AttentionCost | None = None,
                 block_size: int = 16):
        """attention: decode attention per layer (measured on a CPU); None: derived from the roofline."""
        self.model, self.hw, self.eff = model, hw, eff
        self.attention = attention or roofline_attention(model, hw, eff)
        self.decode = DecodeCost(self.attention, model.layers, block_size)  # prices the caller's groups
        m = model
        self._w_bytes = float(m.weight_bytes_per_step)
        self._kv_tok = float(m.kv_bytes_per_token)
        self._flop_tok = 2.0 * m.matmul_params
        self._flop_head = 2.0 * m.head_params
        # QK^T and PV: 2 FLOPs per multiply-add, two products, every query head of every layer.
        self._flop_attn = 4.0 * m.layers * m.heads * m.head_dim
        self._bw = hw.mem_bw * eff.bw
        self._peak = hw.peak_flops * eff.flops

    def step(self, tokens: int, seqs: int, samples: int, ctx_read: float, attn_pairs: float,
             chunks: int = 0, decode_us: float = 0.0) -> StepCost:
        """tokens computed (their K/V written); seqs in the step; samples = rows that go through the output
        head; ctx_read = KV tokens prefill chunks read (each chunk's context before it);
        attn_pairs = sum over the chunks' new tokens of the positions they attend to;
        chunks = sequences computing more than one token (prefill chunks);
        decode_us = the decode rows' attention (the step-cost function), run after the matmuls."""
        w_bytes, kv_bytes, mm_flops, attn_flops = self.components(tokens, samples, ctx_read, attn_pairs)
        byts, flops = w_bytes + kv_bytes, mm_flops + attn_flops
        e = self.eff
        serial = 0.0
        if e.kv_bw > 0:
            serial += kv_bytes / (self.hw.mem_bw * e.kv_bw)
            byts_roof = w_bytes
        else:
            byts_roof = byts
        if e.attn_flops > 0:
            serial += attn_flops / (self.hw.peak_flops * e.attn_flops)
            flops_roof = mm_flops
        else:
            flops_roof = flops
        t_mem, t_cmp = byts_roof / self._bw, flops_roof / self._peak
        secs = (max(t_mem, t_cmp) + serial + 1e-6 * decode_us + e.step_overhead_s + e.seq_overhead_s * seqs
                + e.token_overhead_s * tokens + e.chunk_overhead_s * chunks)
        return StepCost(secs, byts, flops, t_mem >= t_cmp)

    def components(self, tokens: int, samples: int, ctx_read: float, attn_pairs: float
                   ) -> tuple[float, float, float, float]:
        """(weight bytes, KV bytes, matmul FLOPs, attention FLOPs) of a step."""
        kv_bytes = self._kv_tok * (ctx_read + tokens)  # read the context, write the new K/V
        mm_flops = self._flop_tok * tokens + self._flop_head * samples
        return self._w_bytes, kv_bytes, mm_flops, self._flop_attn * attn_pairs

    def transfer_seconds(self, host_blocks: int, disk_blocks: int, block_size: int) -> float:
        """Tier traffic of one step, serialised with compute (no overlap assumed: conservative)."""
        if not host_blocks and not disk_blocks:
            return 0.0
        b = self._kv_tok * block_size
        return host_blocks * b / self.hw.link_bw + disk_blocks * b / self.hw.disk_bw

    def tier_prices(self, block_size: int) -> Prices:
        """The KV manager's load-or-recompute prices from this model (kv.load_or_recompute): a block load as
        transfer_seconds charges it; a recomputed token at its marginal compute cost in a prefill (matmuls,
        per-token overhead, its K/V write where KV traffic runs apart), each attended position at the
        attention FLOPs' rate."""
        e, hw = self.eff, self.hw
        token_s = self._flop_tok / self._peak + e.token_overhead_s
        if e.kv_bw > 0:
            token_s += self._kv_tok / (hw.mem_bw * e.kv_bw)
        pair_peak = hw.peak_flops * e.attn_flops if e.attn_flops > 0 else self._peak
        return Prices({"host": self.transfer_seconds(1, 0, block_size),
                       "disk": self.transfer_seconds(0, 1, block_size)},
                      token_s, self._flop_attn / pair_peak)

    def step_for(self, items: list[tuple[int, int, bool]],
                 groups: Iterable[tuple[int, int]] = ()) -> StepCost:
        """items: (start, num_tokens, samples) per scheduled sequence; groups: the decode rows' cascaded
        (members, shared tokens), from the step-cost function's plan (none: plain decode)."""
        return self.step_of([], items, groups)

    def step_of(self, decode_ctx: list[int], items: list[tuple[int, int, bool]],
                groups: Iterable[tuple[int, int]] = ()) -> StepCost:
        """step_for of decode rows with these contexts (one sampled token each, the new one included) followed
        by `items`, without an item per decode row (the simulator prices every step): the same sums in the
        same order."""
        tokens, seqs, samples, ctx, pairs, chunks = step_shape(items)
        n = len(decode_ctx)
        more = decode_contexts(items)
        return self.step(tokens + n, seqs + n, samples + n, ctx, pairs, chunks,
                         decode_us=self.decode.decode_us(decode_ctx + more if more else decode_ctx, groups))


def decode_contexts(items) -> list[int]:
    """Context of each single-token row of (start, num_tokens, samples) items, its new token included."""
    return [start + 1 for start, n, _ in items if n == 1]


def step_shape(items) -> tuple[int, int, int, float, float, int]:
    """(tokens, sequences, samples, context read, attention pairs, prefill chunks) of a step's
    (start, num_tokens, samples) items: the arguments of CostModel.step. Single-token rows (decodes)
    count their token and sample only: their reads are the step-cost function's (decode_contexts)."""
    tokens = samples = chunks = 0
    ctx = pairs = 0.0
    for start, n, s in items:
        tokens += n
        samples += s
        if n == 1:
            continue
        ctx += start
        pairs += n * start + n * (n + 1) / 2  # causal within the chunk
        chunks += 1
    return tokens, len(items), samples, ctx, pairs, chunks
