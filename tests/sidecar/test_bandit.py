"""The bandit law on stationary synthetic rewards: it finds the best arm of each load regime."""

from __future__ import annotations

import math
import random
from collections import Counter

from kvloop.sidecar.bandit import BanditLaw, regime, reward
from kvloop.sidecar.law import Observation
from kvloop.sidecar.settings import BanditParams, Bounds, Settings

S = Settings(law_kind="bandit", batch_cap=Bounds(1, 128, 8, None), watermark=Bounds(0.0, 0.8, 0.1, None),
             step_token_budget=Bounds(64, 8192, 256, None), bandit=BanditParams(seed=7))
POOL, FOOTPRINT = 1000, 0.9 * 1000 / 32  # the memory-derived cap: 32

# two regimes and the budget factor each likes best
LIGHT = dict(queue_depth=0, running=4, num_decoding=4, kv_use=0.3)  # light/decode
SATURATED = dict(queue_depth=10, running=30, num_decoding=15, kv_use=0.9)  # saturated/prefill
BEST = {"light/decode": 0.5, "saturated/prefill": 2.0}


def share(law: BanditLaw, name: str) -> float:
    cap, _, budget = law.targets()
    return 0.85 - 0.15 * abs(math.log2(budget / 1024 / BEST[name])) - 0.01 * abs(cap - 32)


def obs(load: dict, good_share: float, judged: int = 200) -> Observation:
    good = round(good_share * judged)
    return Observation(**load, footprint_blocks=FOOTPRINT, pool_blocks=POOL, slo_good=good,
                       slo_missed={"ttft": judged - good}, slo_slack_count=judged, slo_slack_mean=0.2,
                       requests_arrived=judged)


def test_regimes_and_rewards():
    assert regime(obs(LIGHT, 1.0), 0.85) == "light/decode"
    assert regime(obs(SATURATED, 1.0), 0.85) == "saturated/prefill"
    assert regime(obs({**SATURATED, "kv_use": 0.5}, 1.0), 0.85) == "queued/prefill"
    assert regime(Observation(queue_depth=0, running=0, kv_use=0), 0.85) == "idle"
    assert reward(obs(LIGHT, 0.75), S.bandit) == 0.75
    few = obs(LIGHT, 1.0, judged=2)  # too few for the share: the proxy, the mean slack
    assert reward(few, S.bandit) == 0.2
    assert reward(Observation(queue_depth=0, running=1, kv_use=0), S.bandit) is None


def test_picks_the_best_arm_per_regime_on_stationary_rewards():
    law = BanditLaw(S)
    law.reset(engine_cap=8, engine_watermark=0.1, engine_budget=1024, budget_ceiling=8192)
    rng = random.Random(0)
    played: dict[str, Counter] = {"light/decode": Counter(), "saturated/prefill": Counter()}
    blocks = [("light/decode", LIGHT), ("saturated/prefill", SATURATED)] * 4
    for i, (name, load) in enumerate(blocks):
        for _ in range(100):
            ds = law.decide(obs(load, min(1.0, max(0.0, share(law, name) + rng.gauss(0, 0.02)))))
            assert all(d.reason for d in ds) and "regime" in ds[0].inputs
            if i >= len(blocks) - 2 and law.arm_regime == name:
                played[name][law.arm] += 1
    for name in BEST:
        best = max(range(len(law.arms)), key=lambda a: law.mean(name, a) or -1.0)
        arm = law.arms[best]
        assert (arm.budget_factor, arm.cap_factor) == (BEST[name], 1.0)
        assert played[name].most_common(1)[0][0] == best  # late on, it mostly plays it


def test_same_seed_same_choices():
    def run(seed: int) -> list:
        law = BanditLaw(S.__class__(**{**S.__dict__, "bandit": BanditParams(seed=seed)}))
        law.reset(engine_cap=8, engine_watermark=0.1, engine_budget=1024, budget_ceiling=8192)
        return [law.decide(obs(LIGHT, share(law, "light/decode")))[2].new for _ in range(60)]

    assert run(3) == run(3)


def test_a_safety_cut_holds_the_cap_arms_under_it():
    law = BanditLaw(S)
    law.reset(engine_cap=8, engine_watermark=0.1, engine_budget=1024, budget_ceiling=8192)
    for _ in range(10):
        law.decide(obs(LIGHT, 0.9))
    cap = law.batch_cap
    ds = law.decide(Observation(**{**LIGHT, "kv_use": 0.99}, footprint_blocks=FOOTPRINT, pool_blocks=POOL))
    assert ds[0].reason == "kv_above_band" and law.batch_cap < cap
    limit = law.batch_cap
    for _ in range(S.law.hysteresis_periods * S.bandit.arm_periods):
        law.decide(obs(LIGHT, 0.9))
        assert law.batch_cap <= limit
