"""Named workloads for the simulator, built with the benchmark's own generators (engine.bench):
W1, W1-smoke, W2, W4 at CPU scale, W1 at GPU scale (WORKLOADS.md 'GPU scale'), W3 traces, a
load that changes every few minutes (for the coordinator-period sweep), and the sizing each profile
(and W5, engine.bench.w5_workload) implies."""

from __future__ import annotations

from dataclasses import replace

from kvloop.engine.bench import workloads as bw
from kvloop.engine.sim.modes import SIM_DISK_DIR, Sizing
from kvloop.engine.sim.profiles import Profile

LLAMA3_VOCAB = 128256


def gpu_w1_params(rate: float, duration_s: float = 3600.0, seed: int = 0, **kw) -> bw.W1Params:
    """W1 at GPU scale: 200 documents of 2,000 tokens (Zipf 1.1) and 4-turn chats with the CPU
    lengths; counts fill `duration_s` at `rate` requests/s in all, half questions and half chat turns
    (so sessions = rate * duration / 8); the open-loop stream carries questions and first turns."""
    total = rate * duration_s
    nq, ns = max(1, round(total / 2)), max(1, round(total / 8))
    p = bw.W1Params(num_docs=200, num_doc_questions=nq, num_sessions=ns, seed=seed, vocab_high=LLAMA3_VOCAB,
                    **kw)
    return replace(p, rate=(nq + ns) / duration_s)


def gpu_w1(rate: float, duration_s: float = 3600.0, seed: int = 0, **kw) -> bw.Workload:
    return bw.build_w1(gpu_w1_params(rate, duration_s, seed, **kw), f"W1-gpu@{rate:g}")


def phased_w1(rates: list[float], phase_s: float, seed: int = 0, gpu: bool = True) -> bw.Workload:
    """W1 whose arrival rate changes every `phase_s` seconds (one W1 per phase, shifted in time and
    renamed so ids stay unique; documents and the system prompt are the same in every phase)."""
    out = bw.Workload(f"W1-phased-{'-'.join(f'{r:g}' for r in rates)}x{phase_s:g}s")
    for i, rate in enumerate(rates):
        p = gpu_w1_params(rate, phase_s, seed) if gpu else replace(bw.W1Params(seed=seed), rate=rate)
        wl = bw.build_w1(replace(p, seed=seed), "phase")  # documents and system prompt: the same every phase
        # questions, user turns and arrivals: drawn anew per phase (a phase seed), shared parts kept
        varied = bw.build_w1(replace(p, seed=seed * 1000 + i + 1), "phase")
        t0 = i * phase_s
        for r, v in zip(wl.requests, varied.requests, strict=True):
            prompt = r.prompt[:p.doc_tokens] + v.prompt[p.doc_tokens:]
            out.requests.append(replace(r, request_id=f"p{i}{r.request_id}", arrival_s=v.arrival_s + t0,
                                        prompt=prompt))
        for s, v in zip(wl.sessions, varied.sessions, strict=True):
            out.sessions.append(replace(s, session_id=f"p{i}{s.session_id}", start_s=v.start_s + t0,
                                        user_turns=v.user_turns, think_s=v.think_s))
    return out


def cpu_sizing() -> Sizing:
    return Sizing()


def gpu_sizing(profile: Profile) -> Sizing:
    """vLLM-like limits for an 8B model on one GPU: 256 running sequences, 2,048-token chunked-prefill
    budget, the profile's KV pool, its host tier (default 128 GiB) and its disk tier (default none: sized
    4x the host tier but off); static batches as large as the batch cap."""
    kv = profile.model.kv_bytes_per_token
    host = int((profile.host_bytes or 128 * 2**30) // kv) // 16 * 16
    disk = int(profile.disk_bytes // kv) // 16 * 16 if profile.disk_bytes else 4 * host
    return Sizing(kv_cache_tokens=profile.kv_pool_tokens, host_cache_tokens=host, disk_cache_tokens=disk,
                  static_batch=256, fill_timeout_s=0.5, max_num_seqs=256, max_num_batched_tokens=2048,
                  disk_dir=SIM_DISK_DIR if profile.disk_bytes else None)


def sizing_for(profile: Profile, kv_cache_tokens: int | None = None) -> Sizing:
    """The profile's sizing (cpu_sizing or gpu_sizing), with the device pool a workload prescribes where
    it names one (W5 at CPU scale: 12,288 tokens)."""
    sizing = cpu_sizing() if profile.name == "cpu" else gpu_sizing(profile)
    return replace(sizing, kv_cache_tokens=kv_cache_tokens) if kv_cache_tokens else sizing
