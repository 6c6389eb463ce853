"""P50 and P99 over a window of recent samples (TTFTs, TPOTs): what the engine hook publishes in the
control block, and the simulator's coordinator computes the same way."""

from __future__ import annotations

import math
from collections import deque

WINDOW = 256  # recent samples the percentiles cover


class RecentPercentiles:
    def __init__(self, window: int = WINDOW):
        self.samples: deque[float] = deque(maxlen=window)
        self._pcts = (math.nan, math.nan)  # NaN: nothing seen yet
        self._dirty = False

    def add(self, x: float) -> None:
        self.samples.append(max(0.0, x))
        self._dirty = True

    def p50_p99(self) -> tuple[float, float]:
        """Sorted once per change, not per read (the engine reads them every step)."""
        if self._dirty:
            xs = sorted(self.samples)
            n = len(xs)
            self._pcts = (xs[(n - 1) // 2], xs[min(n - 1, math.ceil(0.99 * n) - 1)])
            self._dirty = False
        return self._pcts
