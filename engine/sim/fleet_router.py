"""The fleet's router model: which replica a request goes to, from what a router can see of each pod.

- round_robin: in turn.
Every policy but round_robin reads the pods' metrics as of the last scrape (fleet.py scrapes on a period); the
load counts of least_load and of the batch-cap signal add the requests the router sent each pod since (a
router counts what it sends), the picker's own scorers do not (as the picker: its queue scorer reads the
scraped queue alone).

- least_load: fewest requests in the pod (running + waiting), ties to the lowest index.
- prefix_aware: the Gateway API Inference Extension's endpoint picker as its default InferencePool chart
  configures it (config/charts/inferencepool/templates/epp-config.yaml: queue-scorer weight 2,
  kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3; the max-score picker, ties broken at
  random). The scorers as pkg/epp/scheduling/framework/plugins read them: the queue scorer
  (max - waiting) / (max - min) over the pods (1 when all are equal); the KV scorer 1 - KV use; the prefix
  scorer the share of the request's prefix blocks that the pod's *approximate* index holds, an index the
  picker keeps itself (prefixcachescorer/plugin.go): the prompt's chained block hashes (it hashes 64
  characters, about 16 tokens; here 16 tokens), at most 256 blocks, recorded for the pod it picked after each
  pick, in a per-pod LRU as large as the pod's KV pool in blocks (its AutoTune). It never sees evictions.
- prefix_aware+signals: the same, with what a kvloop pod exports besides: its batch cap (the coordinator's
  knob: a pod at its cap queues what it gets; scored as the cap's headroom) and its retention watermark (the
  KV scorer measures use against the watermark, above which the pod gives up cached blocks, rather than
  against the whole pool).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from kvloop.engine.kv.hashing import TupleChainKeys

POLICIES = ("round_robin", "least_load", "prefix_aware", "prefix_aware+signals")
# the picker's defaults (prefixcachescorer/plugin.go, epp-config.yaml)
PICKER_BLOCK_TOKENS = 16
PICKER_MAX_BLOCKS = 256
WEIGHTS = {"queue": 2.0, "kv": 2.0, "prefix": 3.0}
CAP_WEIGHT = 2.0  # the batch cap's headroom, in prefix_aware+signals (ours: as heavy as the queue's)


class PodView(Protocol):
    """What a router reads of a pod (the metrics it scrapes)."""

    @property
    def waiting(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...
    @property
    def kv_blocks(self) -> int: ...
    @property
    def batch_cap(self) -> int: ...
    @property
    def watermark(self) -> float: ...


@dataclass(frozen=True)
class Scraped:
    """A pod's metrics as of the router's last scrape."""

    waiting: int
    running: int
    kv_usage: float
    batch_cap: int
    watermark: float


class ApproxPrefixIndex:
    """The picker's per-pod LRU of prefix block hashes (a hash -> pods map beside it)."""

    def __init__(self, pods: int, capacity: list[int]):
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(pods)]
        self.capacity = capacity
        self.pods_of: dict[int, set[int]] = {}

    def longest(self, hashes: list[int]) -> dict[int, int]:
        """Per pod, the leading blocks of `hashes` it holds (the greedy walk of matchLongestPrefix)."""
        out: dict[int, int] = {}
        for h in hashes:
            pods = self.pods_of.get(h)
            if not pods:
                break
            for p in pods:
                out[p] = out.get(p, 0) + 1
        return out

    def add(self, hashes: list[int], pod: int) -> None:
        lru, pods_of = self.lru[pod], self.pods_of
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            pods_of.setdefault(h, set()).add(pod)
        while len(lru) > self.capacity[pod]:
            old, _ = lru.popitem(last=False)
            s = pods_of[old]
            s.discard(pod)
            if not s:
                del pods_of[old]


@dataclass
class Pick:
    pod: int
    scores: dict[str, float] | None = None  # the chosen pod's per-scorer scores (prefix-aware policies)


class Router:
    def __init__(self, policy: str, pods: list[PodView], seed: int = 0, salt: bytes = b"router"):
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r} ({', '.join(POLICIES)})")
        self.policy, self.pods = policy, pods
        self._next = 0
        self._rng = random.Random(seed)
        self._hash = TupleChainKeys(PICKER_BLOCK_TOKENS, salt)
        self.index = ApproxPrefixIndex(len(pods), [p.kv_blocks for p in pods]) if policy.startswith(
            "prefix") else None
        self.picks = [0] * len(pods)
        self.metrics: list[Scraped] = []
        self.sent = [0] * len(pods)  # requests sent to each pod since the last scrape (the router knows them)
        self.scrape()

    def scrape(self) -> None:
        """Reads every pod's metrics (the picker refreshes them on a period, fleet.py's scrape_s)."""
        self.metrics = [Scraped(p.waiting, p.running, p.kv_usage, p.batch_cap, p.watermark)
                        for p in self.pods]
        self.sent = [0] * len(self.pods)

    def pick(self, prompt: list[int]) -> Pick:
        if self.policy == "round_robin":
            pod = self._next
            self._next = (pod + 1) % len(self.pods)
            out = Pick(pod)
        elif self.policy == "least_load":
            loads = [m.running + m.waiting + n for m, n in zip(self.metrics, self.sent, strict=True)]
            out = Pick(loads.index(min(loads)))
        else:
            out = self._score(prompt)
        self.picks[out.pod] += 1
        self.sent[out.pod] += 1
        return out

    def _score(self, prompt: list[int]) -> Pick:
        hashes = self._hash(prompt, PICKER_MAX_BLOCKS)
        matched = self.index.longest(hashes)
        queues = [m.waiting for m in self.metrics]  # as scraped (the picker's queue scorer reads no more)
        lo, hi = min(queues), max(queues)
        signals = self.policy == "prefix_aware+signals"
        best, best_score, best_parts, ties = -1, -1.0, None, 0
        for i, (p, sent) in enumerate(zip(self.metrics, self.sent, strict=True)):
            parts = {"queue": 1.0 if hi == lo else (hi - queues[i]) / (hi - lo),
                     "prefix": matched.get(i, 0) / len(hashes) if hashes else 0.0}
            if signals:
                w = p.watermark
                parts["kv"] = max(0.0, 1.0 - p.kv_usage / w) if w > 0 else 0.0
                parts["cap"] = max(0.0, 1.0 - (p.running + p.waiting + sent) / max(1, p.batch_cap))
            else:
                parts["kv"] = 1.0 - p.kv_usage
            score = sum(WEIGHTS.get(k, CAP_WEIGHT) * v for k, v in parts.items())
            if score > best_score:
                best, best_score, best_parts, ties = i, score, parts, 1
            elif score == best_score:  # the max-score picker's random tie-break (reservoir: one pass)
                ties += 1
                if self._rng.randrange(ties) == 0:
                    best, best_parts = i, parts
        self.index.add(hashes, best)  # PreRequest: the picked pod is assumed to hold the prompt now
        return Pick(best, best_parts)
