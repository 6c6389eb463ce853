"""min_tokens (vLLM's): until a request has that many output tokens, EOS and its stop token ids cannot be
sampled and its stop strings do not end it; afterwards it is the plain run again."""

from __future__ import annotations

import pytest
import torch
from test_output_stop_rules import _run

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.runner.logits_processors import MinTokens, SampleRow


def test_the_processor_bans_eos_and_stop_ids_until_min_tokens():
    logits = torch.zeros(1, 8)
    proc = MinTokens(eos_token_ids=[7])
    row = SampleRow("r", SamplingParams(max_tokens=9, min_tokens=2, stop_token_ids=[3]))
    assert proc.wants(row)
    proc.apply(logits, [row])
    assert logits[0, 7] == logits[0, 3] == float("-inf") and logits[0, :3].eq(0).all()
    ignore = SampleRow("r", SamplingParams(max_tokens=9, min_tokens=2, ignore_eos=True))
    logits = torch.zeros(1, 8)
    proc.apply(logits, [ignore])
    assert logits.eq(0).all()  # ignore_eos and no stop ids: nothing to hold back
    assert not proc.wants(SampleRow("r", SamplingParams(max_tokens=9)))


def test_stop_strings_wait_for_min_tokens():
    assert _run(SamplingParams(max_tokens=9, stop=["b"]), "abcb") == ("stop", "a", [97, 98])
    # "b" at the 2nd token is before min_tokens 3: held back; the 4th token's "b" ends it
    assert _run(SamplingParams(max_tokens=9, stop=["b"], min_tokens=3), "abcb") == ("stop", "abc",
                                                                                     [97, 98, 99, 98])


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


def test_the_engine_generates_past_eos_until_min_tokens(make_engine, tokenizer):
    engine = make_engine()
    prompt = tokenizer.encode("Say yes.")
    eos = engine.eos_token_ids
    engine.add_request("plain", prompt, SamplingParams(max_tokens=48, temperature=0.0))
    out = engine.drain()["plain"]
    short = len(out.token_ids)
    assert out.finish_reason == "stop" and short < 40, (out.finish_reason, short)  # greedy ends on EOS
    engine.add_request("held", prompt, SamplingParams(max_tokens=48, temperature=0.0, min_tokens=short + 4))
    held = engine.drain()["held"]
    assert len(held.token_ids) >= short + 4
    assert not set(held.token_ids[: short + 4]) & set(eos)
    assert held.token_ids[:short] == out.token_ids  # the same greedy tokens up to where EOS was


def test_a_speculating_rows_tokens_count_one_at_a_time():
    """A step's several tokens are appended before they are digested: min_tokens counts to the token at
    hand, so a stop string in the step's 2nd token (below min_tokens 3) does not end the request."""
    from test_output_stop_rules import Letters

    from kvloop.engine.core.sequence import Sequence
    from kvloop.engine.output_processor import OutputState
    from kvloop.engine.tokenizer.detokenizer import IncrementalDetokenizer

    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=9, stop=["b"], min_tokens=3))
    state = OutputState(seq, IncrementalDetokenizer(Letters()))
    step = [ord(c) for c in "abcb"]
    seq.token_ids.extend(step)  # as bookkeeping.advance appends a speculating row's kept tokens
    reasons = [state.on_token(t, None) for t in step]
    assert reasons == [None, None, None, "stop"]
