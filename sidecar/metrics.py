"""Prometheus metrics of the sidecar (kvloop:feedback_*), read live from the coordinator."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

MODES = ("off", "observe", "enforce")


class FeedbackCollector(Collector):
    def __init__(self, coordinator=None):
        self.c = coordinator

    def collect(self):
        c = self.c
        cap = GaugeMetricFamily("kvloop:feedback_batch_cap", "Batch cap the coordinator targets.")
        mark = GaugeMetricFamily("kvloop:feedback_watermark", "Retention watermark the coordinator targets.")
        budget = GaugeMetricFamily("kvloop:feedback_step_token_budget",
                                   "Step token budget (prefill chunk size) the coordinator targets.")
        memory_max = GaugeMetricFamily("kvloop:feedback_memory_max_batch_cap",
                                       "The batch cap the device pool holds "
                                       "at the observed footprint of a request (absent until a request is "
                                       "seen).")
        inputs = GaugeMetricFamily("kvloop:feedback_decision_input",
                                   "The inputs of the last decision on each "
                                   "knob (what it was taken on).", labels=["knob", "input"])
        decisions = CounterMetricFamily("kvloop:feedback_decisions",
                                        "Coordinator decisions by knob and reason.",
                                        labels=["knob", "reason"])
        stale = CounterMetricFamily("kvloop:feedback_stale_reads",
                                    "Snapshot reads that were missing or stale.")
        writes = CounterMetricFamily("kvloop:feedback_target_writes", "Targets written to the control block.")
        last = GaugeMetricFamily("kvloop:feedback_last_decision_timestamp_seconds",
                                 "Unix time of the last decision.")
        converged = GaugeMetricFamily("kvloop:feedback_converged", "1 when no knob moved for a few periods.")
        mode = GaugeMetricFamily("kvloop:feedback_mode", "1 for the current mode.", labels=["mode"])
        hits = GaugeMetricFamily("kvloop:feedback_hit_rate",
                                 "Prefix-cache hit rate over the last period: per tier "
                                 "its hits over the tokens asked of it; 'all': every tier's hits over the "
                                 "tokens looked up.", labels=["tier"])
        if c is not None:
            cap.add_metric([], c.law.batch_cap)
            mark.add_metric([], c.law.watermark)
            budget.add_metric([], c.law.step_token_budget)
            if c.law.memory_max is not None:
                memory_max.add_metric([], c.law.memory_max)
            with c.lock:
                totals = dict(c.decisions_total)
                # the latest decision of each knob that was taken on inputs (holds on a
                # stale snapshot were not)
                last_inputs = {d["knob"]: d["inputs"] for d in c.recent if d["inputs"]}
            for knob, values in sorted(last_inputs.items()):
                for name, value in sorted(values.items()):
                    if isinstance(value, (int, float)):
                        inputs.add_metric([knob, name], float(value))
            for (knob, reason), n in sorted(totals.items()):
                decisions.add_metric([knob, reason], n)
            stale.add_metric([], c.stale_reads)
            writes.add_metric([], c.writes)
            last.add_metric([], c.last_decision_ts)
            converged.add_metric([], 1.0 if c.law.converged else 0.0)
            for m in MODES:
                mode.add_metric([m], 1.0 if c.settings.mode == m else 0.0)
            obs = c.last_obs
            if obs is not None and obs.hit_rate is not None:
                hits.add_metric(["all"], obs.hit_rate)
                for tier, rate in obs.tier_hit_rates.items():
                    hits.add_metric([tier], rate)
        yield from (cap, mark, budget, memory_max, inputs, decisions, stale, writes, last, converged, mode,
                    hits)


def build_registry(coordinator=None) -> CollectorRegistry:
    """The sidecar's registry; without a coordinator it still lists every metric name (dashboards)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(FeedbackCollector(coordinator))
    return registry
