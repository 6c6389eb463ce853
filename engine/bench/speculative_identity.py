"""Greedy identity under speculation (issue 56; the project's rule: a speculated token must be the token a
cold greedy run gives). The same prompts go to a server with speculation off and one with it on (same
dtype); every completion must match: the same text and the same number of tokens (with --identity-logprobs
also the same per-token texts). The mix: copy-heavy questions (speculation drafts and is accepted) and W1's
prompts (synthetic tokens: drafts mostly rejected), so both the accept and the reject paths are checked."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx

from kvloop.engine.bench.copy_workload import CopyParams, build_copy
from kvloop.engine.bench.speculative_streams import complete
from kvloop.engine.bench.workloads import RequestSpec, W1Params, build_w1

QUESTIONS_PER_DOC = 5
W1_SCALE = 0.1  # 200-token documents: the identity check needs many prompts, not long ones


def identity_prompts(
    n: int, seed: int, tokenizer, max_tokens: int, doc_tokens: int = 160
) -> list[RequestSpec]:
    """n prompts: half copy-heavy (n/10 documents x 5 questions), half W1 (document questions and first chat
    turns), interleaved, deterministic by seed."""
    n_copy = n // 2
    docs = max(1, math.ceil(n_copy / QUESTIONS_PER_DOC))
    copy = build_copy(
        CopyParams(
            num_docs=docs,
            doc_tokens=doc_tokens,
            questions_per_doc=QUESTIONS_PER_DOC,
            answer_tokens=max_tokens,
            seed=seed,
        ),
        tokenizer,
    ).requests[:n_copy]
    n_w1 = n - len(copy)
    sessions = max(1, n_w1 // 5)
    p = replace(
        W1Params(
            num_docs=4, num_doc_questions=n_w1 - sessions, num_sessions=sessions, turns=1, seed=seed
        ).scaled(W1_SCALE),
        answer_tokens=max_tokens,
        reply_tokens=max_tokens,
    )
    wl = build_w1(p, "W1")
    w1 = wl.requests + [
        RequestSpec(s.turn_id(0), "chat", 0.0, s.prompt(0, []), max_tokens, "chat") for s in wl.sessions
    ]
    out: list[RequestSpec] = []
    for i in range(max(len(copy), len(w1))):
        out += [x[i] for x in (copy, w1) if i < len(x)]
    return out[:n]


def run_all(
    base_url: str,
    model: str,
    prompts: list[RequestSpec],
    concurrency: int,
    logprobs: bool,
    timeout_s: float = 600.0,
) -> dict[str, dict]:
    """request id -> complete()'s answer, `concurrency` requests in flight."""
    with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(concurrency) as pool:
        futures = {
            r.request_id: pool.submit(complete, client, base_url, r.prompt, r.max_tokens, logprobs, model)
            for r in prompts
        }
        return {rid: f.result() for rid, f in futures.items()}


def compare(off: dict[str, dict], on: dict[str, dict]) -> dict:
    """Identical count and the ids that differ (or failed on either side)."""
    mismatches = []
    for rid, a in off.items():
        b = on.get(rid, {"error": "missing"})
        same = (
            "error" not in a
            and "error" not in b
            and a["text"] == b["text"]
            and (a["completion_tokens"] == b["completion_tokens"])
            and a.get("tokens") == b.get("tokens")
        )
        if not same:
            mismatches.append(rid)
    errors = {rid: x["error"] for side in (off, on) for rid, x in side.items() if "error" in x}
    return {
        "compared": len(off),
        "identical": len(off) - len(mismatches),
        "mismatches": mismatches,
        "errors": dict(list(errors.items())[:5]),
    }
