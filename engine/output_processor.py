"""Per-request text output: incremental detokenization, stop conditions, and streaming deltas.

Text that could still turn out to be the start of a stop string is held back until it is decided, so a
streamed response never shows text that the final response would not contain."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvloop.engine.core.sequence import Sequence, TokenLogprob
from kvloop.engine.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass
class RequestOutput:
    request_id: str
    text: str  # all text so far (final text once finished)
    delta: str  # text new since the previous output
    token_ids: list[int]  # all generated token ids so far
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    error: str | None = None
    num_output_tokens: int = 0  # tokens generated, the stop token included (usage counts)
    arrival_time: float = 0.0  # time.monotonic() stamps, for latency metrics
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    error_stage: str | None = None  # where a request failed alone: sampling, a logits processor, output, step


class OutputState:
    def __init__(self, seq: Sequence, detok: IncrementalDetokenizer):
        self.seq = seq
        self.detok = detok
        self.stopped_on_token = False  # ended by a stop token, which the output leaves out
        self.holdback = max((len(s) for s in seq.params.stop), default=1) - 1
        self.emitted = 0  # characters of text already sent
        self.sent_tokens = 0
        self.sent_logprobs = 0
        # output tokens digested: a speculating row's tokens are all appended to seq before they are digested
        # one by one, so seq's count runs ahead of the token at hand (min_tokens counts to this one)
        self.digested = seq.num_output_tokens
        self.text = ""

    def on_token(self, token: int, finish_reason: str | None) -> str | None:
        """Digests one sampled token (already appended to seq), given the scheduler's verdict on it
        (bookkeeping.finish_reason: "stop" for a stop token, "length", or None); returns the request's
        finish reason. A stop string completed by the token ends the request too, and wins over "length"."""
        p = self.seq.params
        self.digested += 1
        if finish_reason == "stop":  # a stop token: not part of the text
            self.stopped_on_token = True
            self.text = self.detok.text + self.detok.flush()
            return "stop"
        delta = self.detok.add(token)
        self.text = self.detok.text
        if delta and p.stop and self.digested >= p.min_tokens:
            search_from = max(0, len(self.text) - len(delta) - self.holdback)
            for s in p.stop:
                at = self.text.find(s, search_from)
                if at >= 0:
                    self.text = self.text[: at + (len(s) if p.include_stop_str_in_output else 0)]
                    return "stop"
        if finish_reason is not None:
            self.text = self.detok.text + self.detok.flush()
        return finish_reason

    def output(self, finished: bool, reason: str | None) -> RequestOutput:
        seq = self.seq
        visible = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
        delta = self.text[self.emitted : visible]
        self.emitted = visible
        tokens = seq.output_token_ids
        if finished and reason == "stop" and self.stopped_on_token:
            tokens = tokens[:-1]  # the stop token itself is not part of the output
        new = tokens[self.sent_tokens :]
        self.sent_tokens = len(tokens)
        lps = seq.logprobs[self.sent_logprobs :]
        self.sent_logprobs = len(seq.logprobs)
        return RequestOutput(seq.request_id, self.text[:visible], delta, list(tokens), list(new), finished,
                             reason,
                             seq.num_prompt_tokens, seq.num_cached_tokens, lps, None, seq.num_output_tokens,
                             seq.arrival_time, seq.first_scheduled_time, seq.first_token_time,
                             seq.finished_time)
