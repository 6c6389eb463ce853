"""Whether a prefix found in a lower tier (host, disk, remote) is loaded or recomputed (pure Python).

A host or disk load is not always faster than recomputing: on a GPU, 16 tokens of an 8B model prefill in
about 0.4 ms while their K/V (2 MiB) takes as long from a 5 GB/s disk. The decision compares, per block,
the cost of loading it from its tier with the cost of recomputing its tokens (a cost per token plus one
per attended position, which grows along the prompt), and keeps the cut that costs least:
`blocks_to_use` is the one function every caller asks, the engine with measured prices (`TierCosts`) and
the simulator with its cost model's (`engine/sim/cost.py`, `CostModel.tier_prices`).

Prices: loads per block, measured where the tier mover copies (an exponential moving average, starting
from a prior computed from the block's bytes); recomputing per token, from the engine's measured prefill
throughput (`observe_compute`) or the simulator's model. Until recomputing has a price the answer is
"load" (what the cache did before it measured anything)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

HOST_PRIOR_BYTES_S = 10e9  # a host -> device block copy before any is measured (a CPU memcpy; PCIe is faster)
DISK_PRIOR_BYTES_S = 1e9  # a block file read and checked, before any is measured
# a value fetched from the remote store and checked, before any is measured: 10 GbE less its overheads; the
# reads and writes then measure the link (kv.remote_client)
REMOTE_PRIOR_BYTES_S = 1e9
DEFAULT_BLOCK_LOAD_S = 1e-4  # a prior when the block's bytes are unknown (no tier mover)


@dataclass(frozen=True)
class Prices:
    """Seconds. load_block_s: loading one block from a tier ("host", "disk"); token_s: recomputing one
    prompt token (None: not known, so loads win); pair_s: each position a recomputed token attends to."""

    load_block_s: dict[str, float] = field(default_factory=dict)
    token_s: float | None = None
    pair_s: float = 0.0


def load_s(prices: Prices | TierCosts, tier: str) -> float:
    """Loading one block from `tier` at these prices."""
    return prices.load_block_s.get(tier, DEFAULT_BLOCK_LOAD_S)


def recompute_s(prices: Prices | TierCosts, block_size: int, start: int) -> float:
    """Recomputing one block whose first token is at position `start` (tokens start .. start+bs-1 attend to
    start+1 .. start+bs positions); recomputing must have a price (token_s)."""
    bs = block_size
    return bs * prices.token_s + prices.pair_s * (bs * start + bs * (bs + 1) / 2)


def blocks_to_use(tiers: Sequence[str], block_size: int, prices: Prices) -> int:
    """How many leading blocks of a match to attach: all device blocks (free), then the cut through the
    lower-tier blocks that minimises loading the blocks before it plus recomputing the matched tokens after
    it. A lower-tier block is loaded only when that is strictly cheaper (ties recompute: no copy)."""
    n = len(tiers)
    device = 0
    while device < n and tiers[device] == "device":
        device += 1
    if device == n or prices.token_s is None:
        return n
    best, saving, best_saving = device, 0.0, 0.0
    for i in range(device, n):
        saving += recompute_s(prices, block_size, i * block_size) - load_s(prices, tiers[i])
        if saving > best_saving:
            best, best_saving = i + 1, saving
    return best


class TierCosts:
    """The prices the KV manager decides with: measured (moving averages over priors) or fixed by a model."""

    def __init__(self, alpha: float = 0.1):
        self.alpha = alpha
        self.load_block_s = {"host": DEFAULT_BLOCK_LOAD_S, "disk": 10 * DEFAULT_BLOCK_LOAD_S,
                             "remote": 10 * DEFAULT_BLOCK_LOAD_S}
        self.token_s: float | None = None
        self.pair_s = 0.0
        self.loads_measured = {"host": 0, "disk": 0, "remote": 0}
        self.fixed = False  # prices set by a cost model (the simulator): measurements are ignored

    def set_load_prior(self, block_bytes: int) -> None:
        """Priors from a block's size, for tiers nothing has been measured on yet."""
        for tier, rate in (("host", HOST_PRIOR_BYTES_S), ("disk", DISK_PRIOR_BYTES_S),
                           ("remote", REMOTE_PRIOR_BYTES_S)):
            if not self.loads_measured[tier] and not self.fixed:
                self.load_block_s[tier] = block_bytes / rate

    def observe_load(self, tier: str, blocks: int, seconds: float) -> None:
        """A measured copy of `blocks` blocks from `tier` to the device."""
        if self.fixed or blocks <= 0:
            return
        # from the prior on: one slow first copy (page faults, a cold cache) must not decide alone
        self.load_block_s[tier] = self._ema(self.load_block_s[tier], seconds / blocks)
        self.loads_measured[tier] += 1

    def observe_compute(self, tokens: int, seconds: float) -> None:
        """A measured prefill: `tokens` prompt tokens computed in `seconds` (the engine's throughput)."""
        if self.fixed or tokens <= 0:
            return
        per_token = seconds / tokens
        self.token_s = per_token if self.token_s is None else self._ema(self.token_s, per_token)

    def fix(self, prices: Prices) -> None:
        """Prices from a cost model, kept as they are (the simulator's: the same decision from its model)."""
        self.load_block_s.update(prices.load_block_s)
        self.token_s, self.pair_s, self.fixed = prices.token_s, prices.pair_s, True

    def prices(self) -> Prices:
        return Prices(dict(self.load_block_s), self.token_s, self.pair_s)

    def blocks_to_use(self, tiers: Sequence[str], block_size: int) -> int:
        if self.token_s is None or not tiers or tiers[-1] == "device":  # device blocks lead a match
            return len(tiers)
        return blocks_to_use(tiers, block_size, Prices(self.load_block_s, self.token_s, self.pair_s))

    def _ema(self, old: float, new: float) -> float:
        return old + self.alpha * (new - old)
