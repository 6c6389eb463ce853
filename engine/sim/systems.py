"""One system (a name `kvloop simulate --modes` accepts: a mode, a fixed cap, a TPOT target, the coordinator)
run through the simulator on one workload, judged by the SLO: what `kvloop simulate` and the H200 matrix
(sim/matrix.py) both run."""

from __future__ import annotations

import time

from kvloop.engine.bench.sizing import Sizing
from kvloop.engine.bench.workloads import Workload
from kvloop.engine.core.policy import get_policy
from kvloop.engine.core.slo import Slo
from kvloop.engine.sim.profiles import Profile
from kvloop.engine.sim.slo_report import slo_for, slo_report


def run_system(name: str, profile: Profile, wl: Workload, sizing: Sizing,
               feedback=None, until_s: float | None = None, max_model_len: int | None = None,
               slo: Slo | None = None) -> dict:
    """The run's result (Simulator.run()'s, its phase report, and `slo`: slo_report under `slo`, default the
    profile's scale's). `wl`: a fresh workload (a run's chat sessions consume their replies);
    `feedback`: the coordinator's settings for +coord systems and feedback-loop modes (None: the sidecar's
    defaults for +coord, no coordinator for the rest); `max_model_len` None: the profile model's context."""
    from kvloop.engine.bench.w5_variants import coordinator_settings, parse_variant, sized
    from kvloop.engine.bench.w5_workload import phases_of
    from kvloop.engine.sim.simulator import SimConfig, Simulator
    from kvloop.engine.sim.workload import BenchWorkload

    v = parse_variant(name)
    if v.coordinator:
        fb = coordinator_settings(v, feedback)[0]
    else:  # a fixed cap runs without the coordinator; plain modes as `feedback` says, where it steers them
        fb = feedback if get_policy(v.mode).feedback_loop and not v.cap else None
    t = time.perf_counter()
    sim = Simulator(profile, BenchWorkload(wl),
                    SimConfig(mode=v.mode, sizing=sized(v, sizing), until_s=until_s, feedback=fb,
                              max_model_len=max_model_len or profile.model.context))
    res = sim.run()
    res["sim"]["wall_s"] = time.perf_counter() - t
    res.update(sim.rec.phase_report(phases_of(wl)))
    res["slo"] = slo_report(sim.rec.records.values(), slo or slo_for(profile.name))
    return {"system": name, "workload": wl.name, **res}
