"""/v1/chat/completions: the chat template, then one engine request per choice; JSON or SSE out."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from jinja2.exceptions import TemplateError

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.errors import bad_request
from kvloop.engine.server.protocol import ChatCompletionRequest, TokenizeChatRequest
from kvloop.engine.server.serving import (
    Call,
    ServerSettings,
    api_errors,
    check_model,
    check_prompt,
    check_unicode,
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


def check_contents(req: ChatCompletionRequest | TokenizeChatRequest) -> None:
    """OpenAI requires content on every message except an assistant's with tool_calls, which this server
    refuses anyway: a null or missing content is the client's mistake, not an empty turn."""
    for i, m in enumerate(req.messages):
        if m.content is None:
            raise bad_request(f"messages[{i}].content: a {m.role} message needs content (a string or text "
                              "parts); it is null or missing", f"messages[{i}].content")


def chat_prompt(engine: AsyncEngine, req: ChatCompletionRequest | TokenizeChatRequest) -> list[int]:
    # "developer" is OpenAI's newer name for the system role; templates know only "system". name and
    # tool_call_id reach the template, which uses them where the model's format has a place for them.
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text(),
                 **{k: v for k in ("name", "tool_call_id") if (v := getattr(m, k)) is not None}}
                for m in req.messages]
    for i, m in enumerate(messages):
        for key in ("content", "name", "tool_call_id"):
            if key in m:
                check_unicode(m[key], f"messages[{i}].{key}")
    try:
        # control tokens from the template alone: special-token text in a message stays text
        ids = engine.tokenizer.encode_chat(messages, add_generation_prompt=req.add_generation_prompt)
    except TemplateError as exc:
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    if req.add_special_tokens and not adds_no_special_tokens(engine):
        # vLLM would add the tokenizer's special tokens to the rendered template (a second BOS)
        raise bad_request("add_special_tokens: this model's tokenizer adds special tokens that its chat "
                          "template already holds; send false", "add_special_tokens")
    return ids


def adds_no_special_tokens(engine: AsyncEngine) -> bool:
    """Whether encoding a text with the tokenizer's special tokens gives the text's own tokens: then
    add_special_tokens true and false give the same prompt, and either is served exactly."""
    tok = engine.tokenizer
    if tok.add_bos and tok.bos_token_id is not None:
        return False
    return tok.backend.encode("a", add_special_tokens=True).ids == tok.backend.encode(
        "a", add_special_tokens=False).ids


def token_logprobs(engine: AsyncEngine, pairs) -> list[dict]:
    """OpenAI chat logprobs from (token id, TokenLogprob) pairs."""
    tok = engine.tokenizer

    def entry(tid: int, lp: float) -> dict:
        text = tok.token_text(tid)
        return {"token": text, "logprob": json_logprob(lp), "bytes": list(text.encode("utf-8", "replace"))}

    return [{**entry(t, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
            for t, lp in pairs]


def prepare_chat(req: ChatCompletionRequest, engine: AsyncEngine,
                 settings: ServerSettings) -> tuple[list[int], list[SamplingParams]]:
    """Every check of a chat request, then its prompt and each choice's sampling parameters: what
    /v1/chat/completions submits and /v1/chat/completions/render shows."""
    check_model(engine, settings, req.model)
    check_unsupported(req)
    check_contents(req)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    with api_errors():
        ids = chat_prompt(engine, req)
        wanted = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = check_prompt(engine, ids, wanted, "messages")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        bias, grammar = logit_bias_of(engine, req), grammar_of(engine, req)
        return ids, [sampling_params(req, max_tokens, logprobs, c, bias, grammar) for c in range(req.n)]


async def create_chat_completion(req: ChatCompletionRequest, request: Request, engine: AsyncEngine,
                                 settings: ServerSettings):
    ids, params = prepare_chat(req, engine, settings)
    with api_errors():
        call = Call(engine, settings, request, response_id=req.request_id)
        call.submit([ids], [params], user_of(req))
    ordered = await respond(call, req, _stream)
    if isinstance(ordered, Response):
        return ordered
    choices = [{"index": call.index[o.request_id], "message": {"role": "assistant", "content": o.text},
                "logprobs": None, "finish_reason": o.finish_reason} for o in ordered]
    if req.logprobs:
        for choice, o in zip(choices, ordered, strict=True):
            choice["logprobs"] = {"content": token_logprobs(engine, call.logprobs.get(o.request_id, []))}
    return JSONResponse({"id": f"chatcmpl-{call.public_id}", "object": "chat.completion",
                         "created": call.created,
                         "model": req.model, "choices": choices, "usage": usage(ordered, call.prompt_of)})


def _stream(call: Call, req: ChatCompletionRequest, first, include_usage: bool) -> AsyncIterator[str]:
    head = {"id": f"chatcmpl-{call.public_id}", "object": "chat.completion.chunk", "created": call.created,
            "model": req.model}

    def choice(index: int, delta: dict, finish: str | None = None, logprobs=None) -> dict:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    def choices_of(rid: str, out: RequestOutput) -> list[dict]:
        index = call.index[rid]
        pairs = zip(out.new_token_ids, out.new_logprobs, strict=False)
        lps = {"content": token_logprobs(call.engine, pairs)} if req.logprobs else None
        chunks = [choice(index, {"content": out.delta}, None,
                         lps)] if out.delta or (lps and lps["content"]) else []
        if out.finished:
            chunks.append(choice(index, {}, out.finish_reason))
        return chunks

    opening = [choice(index, {"role": "assistant", "content": ""}) for index in sorted(call.index.values())]
    return sse_events(call, first, head, include_usage, choices_of, lambda index: choice(index, {}, "error"),
                      opening)
