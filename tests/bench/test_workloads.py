"""Workload generators, arrivals and trace readers: shapes from WORKLOADS.md, determinism, no torch."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from kvloop.engine.bench import traces, workloads
from kvloop.engine.bench.arrivals import arrival_times, zipf_weights

AZURE = Path(__file__).resolve().parents[3] / "shared" / "data" / "azure_conv_2023.csv"


def test_w1_shape_and_determinism():
    a, b = workloads.w1(), workloads.w1()
    assert a.num_requests == 120 and len(a.requests) == 60 and len(a.sessions) == 15
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert all(len(r.prompt) == 2050 and r.max_tokens == 150 for r in a.requests)
    s = a.sessions[0]
    assert s.num_turns == 4 and len(s.system) == 100 and len(s.think_s) == 3
    assert all(x.system == s.system for x in a.sessions)  # one shared system prompt
    # zipf: document 0 is the most popular
    counts = Counter(r.group for r in a.requests)
    assert counts.most_common(1)[0][0] == "doc0"
    assert workloads.w1(seed=1).requests[0].prompt != a.requests[0].prompt


def test_chat_prompt_is_history():
    s = workloads.w1_smoke().sessions[0]
    reply = [7] * s.reply_tokens
    p1 = s.prompt(1, [reply])
    assert p1 == s.system + s.user_turns[0] + reply + s.user_turns[1]


def test_smoke_w2_w4():
    smoke = workloads.w1_smoke()
    assert smoke.num_requests == 12 and all(len(r.prompt) == 256 + 50 for r in smoke.requests)
    w2 = workloads.w2(scale=0.1)
    assert len({r.group for r in w2.requests}) == len(w2.requests)
    assert len({tuple(s.system) for s in w2.sessions}) == len(w2.sessions)
    w4 = workloads.w4(pool_tokens=24576, ratio=2.0, oneoff_share=0.33)
    assert w4.params["num_docs"] == round(2 * 24576 / 2000) and not w4.sessions
    assert 0 < sum(r.kind == "oneoff" for r in w4.requests) < len(w4.requests)


def test_arrivals():
    import random

    t = arrival_times(4000, 2.0, random.Random(0))
    assert abs(len(t) / t[-1] - 2.0) < 0.15 and t == sorted(t)
    bursty = arrival_times(4000, 2.0, random.Random(0), burstiness=0.25)
    assert abs(len(bursty) / bursty[-1] - 2.0) < 0.4
    assert arrival_times(3, float("inf"), random.Random(0)) == [0.0, 0.0, 0.0]
    w = zipf_weights(8, 1.1)
    assert abs(sum(w) - 1) < 1e-9 and w == sorted(w, reverse=True)


def test_azure_reader(tmp_path):
    path = AZURE if AZURE.exists() else tmp_path / "a.csv"
    if not AZURE.exists():
        path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.3,396,109\n")
    wl = traces.read_azure_csv(path, limit=2, time_scale=0.5, length_scale=0.5)
    assert len(wl.requests) == 2 and wl.requests[0].arrival_s == 0.0
    assert len(wl.requests[0].prompt) == 187 and wl.requests[0].max_tokens == 22
    assert wl.requests[1].prompt[:10] != wl.requests[0].prompt[:10]


def test_mooncake_equal_ids_share_prefix(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]},
            {"timestamp": 500, "input_length": 800, "output_length": 5, "hash_ids": [1, 4]}]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows))
    wl = traces.read_mooncake_jsonl(p)
    a, b = wl.requests
    assert len(a.prompt) == 1100 and len(b.prompt) == 800 and b.arrival_s == 0.5
    assert a.prompt[:512] == b.prompt[:512] and a.prompt[512:1024] != b.prompt[512:1024]


def test_pure_python_modules_do_not_import_torch():
    code = ("import sys; import kvloop.engine.bench.workloads, kvloop.engine.bench.metrics, "
            "kvloop.engine.bench.traces, kvloop.engine.bench.arrivals; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
