"""Detokenization in the API process (the process backend's FrontOutput) gives what the engine's own
output processing gives: the same deltas step by step (held-back text included), final text, finish reason,
token ids, logprobs and token counts, for stop strings (kept or not), a stop token and the length limit.
Both runs happen inside the serving engine, between its steps (it is idle between tests)."""

from __future__ import annotations

import dataclasses
import functools

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.server.front_output import FrontOutput, params_for_core

PROMPT = "The capital of France is"


def _fields(out) -> tuple:
    return (out.delta, out.text if out.finished else None, list(out.new_token_ids), out.finished,
            out.finish_reason, out.num_output_tokens if out.finished else None,
            [dataclasses.astuple(lp) for lp in out.new_logprobs])


def _run(e, params: SamplingParams, front: bool) -> list[tuple]:
    """The request's outputs, step by step, as the API sees them."""
    ids = e.tokenizer.encode(PROMPT)
    rid = f"front-{front}"
    e.detokenize = not front
    try:
        fo = FrontOutput(rid, params, e.tokenizer) if front else None
        e.add_request(rid, ids, params_for_core(params) if front else params)
        seen = []
        for _ in range(200):
            outs = [o for o in e.step() if o.request_id == rid]
            for out in outs:
                if fo is not None:
                    out, stopped = fo.apply(out)
                    if stopped:
                        e.abort(rid)
                seen.append(_fields(out))
            if seen and seen[-1][3]:
                return seen
        raise AssertionError("no finish in 200 steps")
    finally:
        e.detokenize = True


def _compare(params: SamplingParams, e) -> tuple[list, list]:
    return _run(e, params, False), _run(e, params, True)


def test_front_detokenization_matches_the_engines(server):
    greedy = server.in_engine(functools.partial(_compare, SamplingParams(max_tokens=12, temperature=0,
                                                                           ignore_eos=True)))[0]
    text = "".join(step[0] for step in greedy)
    assert len(text) > 12, text
    mid = text[5:9]  # likely to span tokens
    cases = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[mid]),
             SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[mid],
                            include_stop_str_in_output=True),
             SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=["never there", text[-3:]]),
             SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2, stop=[text[2:4]]),
             SamplingParams(max_tokens=64, temperature=0),  # ends on EOS (a stop token) or the limit
             SamplingParams(max_tokens=3, temperature=0, stop_token_ids=[greedy[1][2][0]])]
    reasons = []
    for params in cases:
        engine, front = server.in_engine(functools.partial(_compare, params))
        assert front == engine, params
        reasons.append(front[-1][4])
    assert reasons[:4] == ["stop"] * 4 and reasons[5] == "stop", reasons  # the stop strings and token hit
    server.assert_no_leak()
