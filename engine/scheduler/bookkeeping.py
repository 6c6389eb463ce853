"""After a step: the one copy of what is recorded for each scheduled sequence (Scheduler.update_from_output
runs it for the engine, the simulator, its fast-forward windows and the tests).

Per item: the computed tokens advance; where the runner sampled, the token (and its logprob) is appended
and the first/last token times are stamped; the finishes that need no text are decided: a stop token (the
request's stop_token_ids, or EOS unless ignore_eos) -> "stop", max_tokens reached -> "length"; a request
the runner failed alone -> "error" (its caller reports it). Stop strings need the detokenized text: the
engine's output processor decides those afterwards."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from kvloop.engine.core.batch import ScheduledSeq, StepResult
from kvloop.engine.core.sequence import Sequence


@dataclass(slots=True)
class Sampled:
    """One sequence that sampled this step, as the caller needs it."""

    seq: Sequence
    token: int | None  # None when the runner failed the request (see error)
    finish_reason: str | None  # "stop", "length", "error", or None: it runs on
    gap: float | None = None  # seconds since its previous token (the inter-token latency); None: its first
    error: tuple[str, str] | None = None  # (stage, what went wrong): the runner failed this request alone
    # every token appended this step, in order (several where proposals were accepted); `token` is the last
    tokens: list[int] = field(default_factory=list)


def finish_reason(seq: Sequence, token: int, eos_token_ids: Collection[int] = ()) -> str | None:
    """Why seq ends with `token` (already appended), or None. A stop token comes first, as it always has."""
    p = seq.params
    if token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
        return "stop"
    if seq.num_output_tokens >= p.max_tokens:
        return "length"
    return None


def tokens_to_length(seq: Sequence, eos_token_ids: Collection[int] = ()) -> int | None:
    """Tokens seq samples until finish_reason ends it at max_tokens ("length"), that last one counted; None
    where a sampled token may stop it before (a stop token, or EOS that it does not ignore)."""
    p = seq.params
    if p.stop_token_ids or (eos_token_ids and not p.ignore_eos):
        return None
    return p.max_tokens - seq.num_output_tokens


def advance(item: ScheduledSeq, result: StepResult, now: float,
            eos_token_ids: Collection[int] = ()) -> Sampled | None:
    """Applies one item of a step that ran (the caller finishes seq when a reason comes back); returns
    None when the item sampled nothing (a prefill chunk short of the prompt's end).

    A speculating row may bring several tokens (StepResult.more_tokens): they are appended one by one, each
    judged by finish_reason as if it came alone, and those after the first finish are discarded. Its
    computed tokens advance by the tokens kept: the first (whose K/V this step wrote) and each kept proposal
    (written at its position), the last kept token left to compute, as every decode row leaves its newest."""
    seq = item.seq
    seq.num_computed_tokens = item.start + item.num_tokens
    if not item.samples:
        return None
    rid = seq.request_id
    error = result.errors.get(rid)
    if error is not None:
        return Sampled(seq, None, "error", error=error)
    token = result.tokens[rid]  # a runner samples exactly the items that complete their sequence
    more = result.more_tokens.get(rid)
    gap = None
    if seq.first_token_time is None:
        seq.first_token_time = now
    else:
        gap = now - seq.last_token_time
    seq.last_token_time = now
    if not more:
        seq.token_ids.append(token)
        logprob = result.logprobs.get(rid)
        if logprob is not None:
            seq.logprobs.append(logprob)
        return Sampled(seq, token, finish_reason(seq, token, eos_token_ids), gap, tokens=[token])
    logprobs = [result.logprobs.get(rid), *result.more_logprobs.get(rid, [None] * len(more))]
    kept: list[int] = []
    reason = None
    for t, lp in zip([token, *more], logprobs, strict=True):
        seq.token_ids.append(t)
        if lp is not None:
            seq.logprobs.append(lp)
        kept.append(t)
        reason = finish_reason(seq, t, eos_token_ids)
        if reason is not None:
            break
    # the kept tokens but the last were proposals the step computed at their positions
    seq.num_computed_tokens = item.start + len(kept)
    return Sampled(seq, kept[-1], reason, gap, tokens=kept)
