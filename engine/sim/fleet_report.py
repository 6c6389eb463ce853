"""A fleet run's numbers: the SLO report over every replica's requests (engine/core/slo.py at the profile's
scale, as sim/slo_report.py judges one replica), throughput, the fleet's prompt-token hit rate, what the
router and the shared tier did, and each replica's share."""

from __future__ import annotations

import dataclasses

from kvloop.engine.bench.metrics import run_span
from kvloop.engine.core.slo import Slo
from kvloop.engine.sim.slo_report import slo_for, slo_report


def hit_rate(records) -> float | None:
    """Prompt tokens served from any cache (device, host, or the shared tier through the host) over the
    prompt tokens of the requests that finished."""
    ok = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    return sum(r.cached_tokens or 0 for r in ok) / prompt if prompt else None


def fleet_summary(fleet, per_replica: list[dict], slo: Slo | None = None) -> dict:
    recs = fleet.records()
    ok = [r for r in recs if r.ok]
    start, end = run_span(recs) if recs else (0.0, 0.0)
    span = max(end - start, 1e-9)
    cfg = fleet.config
    out = {
        "fleet": {"replicas": cfg.replicas, "policy": cfg.policy, "shared_tier": cfg.shared_tier,
                  "mode": cfg.sim.mode, "profile": fleet.profile.name, "model": fleet.profile.model.name,
                  "routed": fleet.routed, "picks": list(fleet.router.picks), "scrape_s": cfg.scrape_s,
                  "late_follow_ups": dict(fleet.late),
                  "virtual_s": max(r.now for r in fleet.replicas),
                  "steps": sum(r.num_steps for r in fleet.replicas)},
        "slo": slo_report(recs, slo or slo_for(fleet.profile.name)),
        "throughput": {"finished_req_s": len(ok) / span,
                       "output_tok_s": sum(r.output_tokens for r in ok) / span,
                       "prompt_tok_s": sum(r.prompt_tokens for r in ok) / span},
        "hit_rate": hit_rate(recs),
        "replicas": [{"requests": len(r.rec.records), "hit_rate": hit_rate(r.rec.records.values()),
                      "steps": r.num_steps, "virtual_s": res["sim"]["virtual_s"],
                      "kv_stats": {k: v for k, v in vars(r.kv.stats).items() if isinstance(v, int | float)}}
                     for r, res in zip(fleet.replicas, per_replica, strict=True)],
    }
    if fleet.shared is not None:
        tier, link = fleet.shared, fleet.shared.link
        out["shared_tier"] = {**tier.stats, "fetched_prompt_tokens": fleet.fetched_tokens,
                              "blocks_held": len(tier.ready), "capacity_blocks": tier.capacity,
                              "link": dataclasses.asdict(link)}
    return out


def headline(res: dict) -> dict:
    """The few numbers a comparison reads."""
    s = res["slo"]
    return {"policy": res["fleet"]["policy"], "shared_tier": res["fleet"]["shared_tier"],
            "replicas": res["fleet"]["replicas"], "goodput_req_s": s["slo_goodput_req_s"],
            "good_share": s["slo_good_share"], "sent": s["slo_sent"],
            "finished_req_s": res["throughput"]["finished_req_s"],
            "output_tok_s": res["throughput"]["output_tok_s"], "hit_rate": res["hit_rate"],
            "ttft_p50_s": s["ttft_p50_s"], "ttft_p99_s": s["ttft_p99_s"],
            "tpot_p50_s": s["tpot_p50_s"], "tpot_p99_s": s["tpot_p99_s"],
            "picks": res["fleet"]["picks"], "cpu_s": res["fleet"].get("cpu_s")}
