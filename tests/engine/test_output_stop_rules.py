"""The output processor follows the scheduler's verdict on each token (stop token, length) and adds the
stop strings, which need the text (pure Python, a toy decoder: token t is the letter chr(t))."""

from __future__ import annotations

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.output_processor import OutputState
from kvloop.engine.scheduler.bookkeeping import finish_reason
from kvloop.engine.tokenizer.detokenizer import IncrementalDetokenizer


class Letters:
    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def _run(params: SamplingParams, tokens: str, eos: set[int] = frozenset()) -> tuple[str | None, str,
                                                                                    list[int]]:
    """Feeds tokens as the engine does (the scheduler's verdict first); returns (reason, text, output ids)."""
    seq = Sequence("r", [1, 2], params)
    state = OutputState(seq, IncrementalDetokenizer(Letters()))
    for t in map(ord, tokens):
        seq.token_ids.append(t)
        reason = state.on_token(t, finish_reason(seq, t, eos))
        if reason is not None:
            out = state.output(True, reason)
            return reason, out.text, out.token_ids
    out = state.output(False, None)
    return None, out.text, out.token_ids


def test_length_stop_token_and_eos():
    assert _run(SamplingParams(max_tokens=3), "abcd") == ("length", "abc", [97, 98, 99])
    assert _run(SamplingParams(max_tokens=9, stop_token_ids=[ord("c")]), "abcd") == ("stop", "ab", [97, 98])
    assert _run(SamplingParams(max_tokens=9), "abcd", eos={ord("b")}) == ("stop", "a", [97])
    assert _run(SamplingParams(max_tokens=9, ignore_eos=True), "abcd", eos={ord("b")}) == (None, "abcd",
                                                                                           [97, 98, 99, 100])


def test_a_stop_string_on_the_last_allowed_token_wins_over_length():
    assert _run(SamplingParams(max_tokens=3, stop=["bc"]), "abcd") == ("stop", "a", [97, 98, 99])
    assert _run(SamplingParams(max_tokens=3, stop=["bc"], include_stop_str_in_output=True), "abcd")[:2] == (
        "stop", "abc")
