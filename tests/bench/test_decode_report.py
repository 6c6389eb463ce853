"""bench/decode.py's pure half: medians, the issue's goals against the peers, the table (no servers)."""

from kvloop.engine.bench import decode_report
from kvloop.engine.core.cpu import parse_cpuinfo


def run(single=None, prefill=None, tpot=None, rss=None, start=None, other=0.1) -> dict:
    r = {"single_stream_tok_s": single, "prefill_tok_s": prefill, "tpot_ms": tpot or {}, "peak_rss_mib": rss,
         "peak_pss_mib": rss, "startup_s": start, "noise": {"other_cores_mean": other}}
    return {k: v for k, v in r.items() if v is not None}


RUNS = {
    "kvloop": [run(50, 900, {"8": 30, "16": 40}, 1000, 30), run(60, 1100, {"8": 34, "16": 44}, 1200, 10)],
    "kvloop-int8": [run(70), run(80)],
    "vllm-cpu-bf16": [run(40, 960, {"8": 30, "16": 35}, 3000, 80)],
    "vllm-cpu-f32": [run(30, 1000, {"8": 32, "16": 50}, 2500, 85)],
    "llama.cpp-bf16": [run(80, 500, {"8": 100, "16": 250}, 600, 1)],
}
META = {"machine": {"model": "cpu", "cores": 2, "flags": ["avx2"], "native_bf16": False}, "threads": 2,
        "reps": 2,
        "reps_done": 2, "quick": False, "command": "bench/decode.py",
        "sizes": {"short_prompt": 16, "single_tokens": 128, "prefill": 2000, "concurrencies": [8, 16],
                  "context": 2000, "tpot_tokens": 48, "per_doc": 16}}


def by_name(goals: list[dict]) -> dict[str, dict]:
    return {g["name"].split(":")[0]: g for g in goals}


def test_medians_and_warm_start_up():
    s = decode_report.summarize(RUNS["kvloop"])
    assert s["single_stream_tok_s"] == 55 and s["tpot_ms"] == {"8": 32, "16": 42}
    assert s["startup_first_s"] == 30 and s["startup_s"] == 10  # the later starts: warm disk cache
    assert decode_report.summarize([run(single=5, start=7)])["startup_s"] == 7  # one rep: its only start
    assert decode_report.summarize([run(single=5)])["prefill_tok_s"] is None  # missing stays missing


def test_single_stream_pools_every_stream_of_every_start():
    # one start's median of its streams is 50, the other's 90; pooled, the median of all five streams is 60
    runs = [{**run(single=50), "single_streams_tok_s": [40, 50, 60]},
            {**run(single=90), "single_streams_tok_s": [90, 95]}]
    assert decode_report.summarize(runs)["single_stream_tok_s"] == 60


def test_goals_against_the_strongest_peer_variant():
    report = decode_report.build_report(RUNS, {}, {"llama.cpp-q8_0": "model-q8_0.gguf not converted"}, META)
    g = by_name(report["goals"])
    prefill = g["prefill tok/s"]  # vLLM's best prefill is its f32 run (1000): 1000 / 1000
    assert prefill["peer_system"] == "vllm-cpu-f32" and prefill["value"] == 1.0 and prefill["met"]
    tpot = g["TPOT at 16 concurrent"]  # vLLM's best TPOT at 16 is bf16's 35 ms; ours 42
    assert tpot["peer_system"] == "vllm-cpu-bf16" and tpot["value"] == 1.2 and not tpot["met"]
    assert g["single-stream decode tok/s"]["value"] == round(55 / 80, 3)
    assert g["peak RSS"]["peer_system"] == "vllm-cpu-f32" and g["peak RSS"]["met"]
    assert g["kvloop start-up seconds (load + compile, warm disk cache)"]["met"]
    int8 = g["int8 single-stream decode tok/s"]
    assert int8["value"] is None and not int8["met"] and "not converted" in int8["why"]
    assert report["quiet"] and g["quiet machine"]["met"]
    assert report["ratios"]["kvloop / llama.cpp-bf16"]["tpot_ms"]["16"] == round(42 / 250, 3)


def test_missing_peer_is_a_note_not_a_crash():
    runs = {"kvloop": RUNS["kvloop"]}
    report = decode_report.build_report(runs, {}, {"vllm-cpu-bf16": "vLLM CPU backend not installed"}, META)
    g = by_name(report["goals"])
    assert g["prefill tok/s"]["status"] == "not run" and "not installed" in g["prefill tok/s"]["why"]
    md = decode_report.markdown(report)
    assert "Skipped: vllm-cpu-bf16 (vLLM CPU backend not installed)" in md and "not run" in md


def test_table_rows_and_noise_flag(tmp_path, monkeypatch):
    runs = {**RUNS, "transformers": [run(20, 700, other=0.9)]}
    report = decode_report.build_report(runs, {"kvloop": "defaults here"}, {}, META)
    md = decode_report.markdown(report)
    assert "| kvloop | defaults here | 55.0 | 1000.0 | 32.0 | 42.0 | 1100 (1100) | 10.0 (30.0) |" in md
    assert "| transformers |  | 20.0 | 700.0 | — | — |" in md  # no TPOT: a dash, not a zero
    assert "NOISY" in md and not report["quiet"]
    # rewriting keeps the hand-written profile section of the old file
    monkeypatch.setattr(decode_report, "chart", lambda report, path: False)
    (tmp_path / "decode.md").write_text("old table\n\n## Profile (by hand)\n\nrows\n")
    decode_report.write(report, tmp_path)
    text = (tmp_path / "decode.md").read_text()
    assert "old table" not in text and text.endswith("## Profile (by hand)\n\nrows\n")


def test_quick_runs_take_the_nearest_concurrency():
    assert decode_report.goal_concurrency(["2", "4"]) == "4"
    assert decode_report.goal_concurrency(["8", "16", "32"]) == "16"


def test_cpu_flags_keep_what_decides_the_kernels():
    cpuinfo = "model name\t: Some CPU\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile\n"
    info = parse_cpuinfo(cpuinfo).record()
    assert info == {"model": "Some CPU", "flags": ["amx_tile", "avx2", "avx512_bf16", "avx512f", "fma"],
                    "native_bf16": True}


def test_failures_are_listed_and_their_numbers_stay_missing():
    runs = {"kvloop": [{**run(50, 900, {"8": 30}),
                        "tpot_errors": {"16": "RemoteProtocolError: server died"}}],
            "llama.cpp-bf16": [{"error": "RuntimeError: no token came back"}],
            "llama.cpp-q8_0": [{**run(60),
                                "prefill_error": "RuntimeError: prefill-2000: no token came back"}]}
    report = decode_report.build_report(runs, {}, {}, META)
    assert report["systems"]["kvloop"]["tpot_ms"] == {"8": 30}  # the failed concurrency is absent, not zero
    text = decode_report.markdown(report)
    assert "- kvloop, repetition 1, TPOT @16: RemoteProtocolError: server died" in text
    assert "- llama.cpp-bf16, repetition 1: RuntimeError: no token came back" in text
    assert "- llama.cpp-q8_0, repetition 1, prefill: RuntimeError: prefill-2000: no token came back" in text
    assert report["systems"]["llama.cpp-q8_0"]["single_stream_tok_s"] == 60  # kept though its prefill failed
