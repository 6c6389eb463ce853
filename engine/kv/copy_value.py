"""Whether copying a block evicted from the device down to the host pays (pure Python).

A copy down is not free: it moves the block's K/V over the host link while the step waits (the tier
mover copies synchronously). It pays back only if the block is asked for again while the copy is held,
and then only what loading saves over recomputing. So the copy is made when

    share asked again x (recompute a block - load a block) > copy a block (= load a block: same link)

with prices from kv.load_or_recompute's TierCosts (measured by the engine, fixed by the simulator's cost
model) and the share measured here, per offer class (how many distinct requests had used the block's hash
when it was evicted, capped): the share of evicted blocks of that class whose hash a later lookup asked for
within `window` evictions (the host slots: about how long a copy stays). Asking is counted whether or not a
copy was made, so a class whose copies are skipped keeps being measured, and copying resumes where it starts
to pay. Counts halve every `window` evictions, so the share follows a shifting load.

Copying is kept (as without this rule) until a class has `min_evictions` evictions counted, or while
recomputing has no price yet. Measured on the simulated H200 with an 8B model (W1 at 20 req/s, copying every
evicted block): blocks used by one request were asked for again 8% of the time, against a break-even of 12.5%,
and charging the copies' traffic raised P99 TTFT from 64 to 69 ms; with a 70B model (W5) 26% against 6%.
On a CPU, recomputing a block costs hundreds of copies: there every class is copied."""

from __future__ import annotations

from collections import OrderedDict

from kvloop.engine.kv.load_or_recompute import Prices, TierCosts, load_s, recompute_s

MIN_EVICTIONS = 256  # per class, before its share decides


class CopyValue:
    def __init__(self, window: int, classes: int, min_evictions: int = MIN_EVICTIONS):
        self.window = max(1, window)
        self.top = classes - 1  # offer counts at or above it share one class
        self.min_evictions = min_evictions
        self._pending: OrderedDict[int, int] = OrderedDict()  # hash -> class, the last `window` evictions
        self.evictions = [0.0] * classes
        self.asked_again = [0.0] * classes
        self._since_halving = 0

    def evicted(self, h: int, offers: int) -> None:
        c = min(offers, self.top)
        pending = self._pending
        pending[h] = c
        pending.move_to_end(h)
        if len(pending) > self.window:
            pending.popitem(last=False)
        self.evictions[c] += 1
        self._since_halving += 1
        if self._since_halving >= self.window:
            self._since_halving = 0
            self.evictions = [n / 2 for n in self.evictions]
            self.asked_again = [n / 2 for n in self.asked_again]

    def asked(self, h: int) -> None:
        """A lookup asked for h and the device does not hold it."""
        c = self._pending.pop(h, None)
        if c is not None:
            self.asked_again[c] += 1

    def share(self, offers: int) -> float | None:
        """Share of this class's evicted blocks asked for again (None: too few evictions counted yet)."""
        c = min(offers, self.top)
        n = self.evictions[c]
        return self.asked_again[c] / n if n >= self.min_evictions else None

    def pays(self, offers: int, block_size: int, prices: Prices | TierCosts) -> bool:
        """Whether a block of this class is worth copying to the host (recomputed at the start of a prompt,
        the cheapest place: a block deeper in also attends to the positions before it)."""
        share = self.share(offers)
        if share is None or prices.token_s is None:
            return True
        load = load_s(prices, "host")
        return share * (recompute_s(prices, block_size, 0) - load) > load
