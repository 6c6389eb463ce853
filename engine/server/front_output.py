"""Detokenization in the API process, for the process backend: the core sends token ids only (its requests
carry no stop strings), and each request's OutputState runs here, over a mirror of its output tokens.

The same OutputState as the in-process engine (engine/output_processor.py): the same text, the same stop
strings, the same held-back text in streams. A stop string found here ends the request here; the caller
then aborts it in the core, which may have run a step or two past it by then."""

from __future__ import annotations

from dataclasses import replace

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import TokenLogprob
from kvloop.engine.output_processor import OutputState, RequestOutput

STOP_TOKEN_PLACEHOLDER = -1  # the stop token the core leaves out: OutputState drops the last token on it


class _Mirror:
    """The attributes of a Sequence that OutputState reads, filled from the core's outputs."""

    def __init__(self, request_id: str, params: SamplingParams):
        self.request_id = request_id
        self.params = params
        self.output_token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.num_prompt_tokens = 0
        self.num_cached_tokens = 0
        self.num_output_tokens = 0
        self.arrival_time = 0.0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None


def params_for_core(params: SamplingParams) -> SamplingParams:
    """The request's parameters less its stop strings, which are matched here."""
    return replace(params, stop=[]) if params.stop else params


class FrontOutput:
    def __init__(self, request_id: str, params: SamplingParams, tokenizer):
        self.mirror = _Mirror(request_id, params)
        self.state = OutputState(self.mirror, tokenizer.detokenizer())

    def apply(self, out: RequestOutput) -> tuple[RequestOutput, bool]:
        """The core's output with its text; True when a stop string ended the request here."""
        m = self.mirror
        m.num_prompt_tokens, m.num_cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
        m.arrival_time, m.first_scheduled_time = out.arrival_time, out.first_scheduled_time
        m.first_token_time, m.finished_time = out.first_token_time, out.finished_time
        new = out.new_token_ids
        reason = None
        stopped_at = None
        for i, token in enumerate(new):
            m.output_token_ids.append(token)
            last = i == len(new) - 1
            reason = self.state.on_token(token, "length" if last and out.finish_reason == "length" else None)
            if reason == "stop":
                stopped_at = i
                break
        if stopped_at is None:
            m.logprobs.extend(out.new_logprobs)
            m.num_output_tokens = out.num_output_tokens
            if out.finished and reason is None:
                if out.finish_reason == "stop":  # a stop token (or EOS), which the core leaves out
                    m.output_token_ids.append(STOP_TOKEN_PLACEHOLDER)
                    reason = self.state.on_token(STOP_TOKEN_PLACEHOLDER, "stop")
                else:  # "error", or "length" with no new token
                    reason = out.finish_reason
        else:  # the tokens the core sampled past the stop string are not part of the output
            m.logprobs.extend(out.new_logprobs[: stopped_at + 1])
            m.num_output_tokens = out.num_output_tokens - (len(new) - stopped_at - 1)
        result = self.state.output(reason is not None, reason)
        result.error, result.error_stage = out.error, out.error_stage
        return result, stopped_at is not None and not out.finished
