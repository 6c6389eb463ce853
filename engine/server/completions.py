"""/v1/completions: a prompt string, token ids, or a list of either; n choices per prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.errors import bad_request
from kvloop.engine.server.protocol import CompletionRequest
from kvloop.engine.server.serving import (
    MAX_CHOICES,
    Call,
    ServerSettings,
    api_errors,
    check_model,
    check_prompt,
    encode,
    grammar_of,
    json_logprob,
    logit_bias_of,
    respond,
    sampling_params,
    sse_events,
    usage,
    user_of,
)
from kvloop.engine.server.unsupported import check_unsupported


def prompts_of(engine: AsyncEngine, prompt, add_special_tokens: bool = True) -> list[list[int]]:
    if isinstance(prompt, str):
        return [encode(engine, prompt, "prompt", add_special_tokens)]
    if isinstance(prompt[0], int):
        return [list(prompt)]
    if len(prompt) > MAX_CHOICES:
        raise bad_request(f"at most {MAX_CHOICES} prompts per request", "prompt")
    if isinstance(prompt[0], str):
        return [encode(engine, p, "prompt", add_special_tokens) for p in prompt]
    return [list(p) for p in prompt]


def echoed_texts(engine: AsyncEngine, prompt, prompts: list[list[int]]) -> list[str]:
    """echo's text for each prompt: the prompt string as sent, or a token-id prompt decoded (as vLLM)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt[0], str):
        return list(prompt)
    return [engine.tokenizer.decode(ids) for ids in prompts]


def prepare_completion(req: CompletionRequest, engine: AsyncEngine,
                       settings: ServerSettings) -> tuple[list[list[int]], list[list[SamplingParams]]]:
    """Every check of a completions request, then its prompts and each prompt's choices' sampling
    parameters: what /v1/completions submits and /v1/completions/render shows."""
    check_model(engine, settings, req.model)
    check_unsupported(req)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    with api_errors():
        prompts = prompts_of(engine, req.prompt, req.add_special_tokens is not False)
        params = []
        bias, grammar = logit_bias_of(engine, req), grammar_of(engine, req)
        for ids in prompts:
            max_tokens = check_prompt(engine, ids, req.max_tokens, "prompt")
            params.append([sampling_params(req, max_tokens, req.logprobs, c, bias,
                                           grammar) for c in range(req.n)])
        return prompts, params


def completion_logprobs(engine: AsyncEngine, pairs, offset: int) -> dict:
    """OpenAI's legacy completions logprobs: parallel lists, text offsets from the choice's start."""
    tok = engine.tokenizer
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, lp in pairs:
        text = tok.token_text(tid)
        out["tokens"].append(text)
        out["token_logprobs"].append(json_logprob(lp.logprob))
        out["top_logprobs"].append({tok.token_text(i): json_logprob(v) for i, v in lp.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


async def create_completion(req: CompletionRequest, request: Request, engine: AsyncEngine,
                            settings: ServerSettings):
    prompts, params = prepare_completion(req, engine, settings)
    echoes = echoed_texts(engine, req.prompt, prompts) if req.echo else None
    with api_errors():
        call = Call(engine, settings, request, response_id=req.request_id)
        call.submit(prompts, params, user_of(req))
    ordered = await respond(call, req, partial(_stream, echoes=echoes))
    if isinstance(ordered, Response):
        return ordered
    choices = []
    for o in ordered:
        lps = None
        if req.logprobs is not None:
            lps = completion_logprobs(engine, call.logprobs.get(o.request_id, []), 0)
        head = echoes[call.prompt_of[o.request_id]] if echoes else ""
        choices.append({"index": call.index[o.request_id], "text": head + o.text, "logprobs": lps,
                        "finish_reason": o.finish_reason})
    return JSONResponse({"id": f"cmpl-{call.public_id}", "object": "text_completion", "created": call.created,
                         "model": req.model, "choices": choices, "usage": usage(ordered, call.prompt_of)})


def _stream(call: Call, req: CompletionRequest, first, include_usage: bool,
            echoes: list[str] | None = None) -> AsyncIterator[str]:
    head = {"id": f"cmpl-{call.public_id}", "object": "text_completion", "created": call.created,
            "model": req.model}
    offsets: dict[str, int] = {}  # text offset of each choice's next token, for its logprobs

    def choices_of(rid: str, out: RequestOutput) -> list[dict]:
        lps = None
        if req.logprobs is not None:
            pairs = list(zip(out.new_token_ids, out.new_logprobs, strict=False))
            lps = completion_logprobs(call.engine, pairs, offsets.get(rid, 0))
            offsets[rid] = offsets.get(rid, 0) + sum(len(t) for t in lps["tokens"])
        if not (out.delta or out.finished or (lps and lps["tokens"])):
            return []
        return [{"index": call.index[rid], "text": out.delta, "logprobs": lps,
                 "finish_reason": out.finish_reason if out.finished else None}]

    def failed_choice(index: int) -> dict:
        return {"index": index, "text": "", "logprobs": None, "finish_reason": "error"}

    # echo: each choice opens with its prompt's text, before any generated token
    opening = [{"index": index, "text": echoes[call.prompt_of[rid]], "logprobs": None, "finish_reason": None}
               for rid, index in sorted(call.index.items(), key=lambda item: item[1])] if echoes else []
    return sse_events(call, first, head, include_usage, choices_of, failed_choice, opening)
