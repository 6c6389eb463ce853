"""The endpoints a router calls to learn a request's tokens before it picks a replica, in vLLM's shapes:
/v1/chat/completions/render and /v1/completions/render (the request checked exactly as the generating
endpoint checks it, then its prompt tokens and sampling parameters, nothing generated), /tokenize and
/detokenize. vllm-router's cache-aware policy posts the chat or completions body to the render endpoint,
and on a 404 the messages or prompt to /tokenize, and reads `token_ids` (render) or `tokens` (/tokenize).

Shapes (vLLM, entrypoints/serve/render and tokenize): chat render answers one object
{request_id, token_ids, features, sampling_params, model, stream, stream_options, cache_salt, priority,
kv_transfer_params}; completions render a list of those, one per prompt; /tokenize answers
{count, max_model_len, tokens, token_strs}; /detokenize {prompt}."""

from __future__ import annotations

import dataclasses
import uuid

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.server.async_engine import AsyncEngine
from kvloop.engine.server.chat import chat_prompt, check_contents, prepare_chat
from kvloop.engine.server.completions import prepare_completion
from kvloop.engine.server.errors import bad_request
from kvloop.engine.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    _Sampling,
)
from kvloop.engine.server.serving import ServerSettings, api_errors, check_model, encode
from kvloop.engine.server.unsupported import check_tokenize_chat

RENDER_RESPONSES = {400: {"description": "invalid request"}, 404: {"description": "unknown model"}}


def sampling_json(params: list[SamplingParams]) -> dict:
    """The first choice's sampling parameters as JSON, with n; the grammar is response_format's, shown by
    its kind alone, and logit_bias keys are strings as JSON requires."""
    first = params[0]
    out = {f.name: getattr(first, f.name) for f in dataclasses.fields(first) if f.name != "grammar"}
    out["logit_bias"] = {str(k): v for k, v in first.logit_bias.items()}
    out["structured_outputs"] = None if first.grammar is None else type(first.grammar).__name__
    return {"n": len(params), **out}


def generate_request(prefix: str, req: _Sampling, ids: list[int], params: list[SamplingParams]) -> dict:
    return {"request_id": f"{prefix}-{req.request_id or uuid.uuid4().hex}", "token_ids": ids,
            "features": None,
            "sampling_params": sampling_json(params), "model": req.model, "stream": req.stream,
            "stream_options": None if req.stream_options is None else req.stream_options.model_dump(),
            "cache_salt": None, "priority": req.priority, "kv_transfer_params": None}


def _validated(model: type[BaseModel], body: dict) -> BaseModel:
    """A body validated as FastAPI would, so that its errors get the same 400 (errors.py)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from exc


def tokenize(body: dict, engine: AsyncEngine, settings: ServerSettings) -> dict:
    """vLLM's /tokenize: a body with messages is a chat (the template applied as the chat endpoint does),
    else a raw prompt."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object with prompt or messages")
    chat = "messages" in body
    req = _validated(TokenizeChatRequest if chat else TokenizeCompletionRequest, body)
    if req.model is not None:
        check_model(engine, settings, req.model)
    with api_errors():
        if chat:
            check_tokenize_chat(req)
            check_contents(req)
            ids = chat_prompt(engine, req)
        else:
            ids = encode(engine, req.prompt, "prompt", req.add_special_tokens)
    out = {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        out["token_strs"] = [engine.tokenizer.token_text(t) for t in ids]
    return out


def detokenize(req: DetokenizeRequest, engine: AsyncEngine, settings: ServerSettings) -> dict:
    if req.model is not None:
        check_model(engine, settings, req.model)
    vocab = engine.vocab_size
    if any(t >= vocab for t in req.tokens):
        raise bad_request(f"tokens must be token ids in [0, {vocab})", "tokens")
    return {"prompt": engine.tokenizer.decode(req.tokens)}


def install(app: FastAPI, engine: AsyncEngine, settings: ServerSettings) -> None:
    @app.post("/v1/chat/completions/render", responses=RENDER_RESPONSES)
    async def render_chat(body: ChatCompletionRequest):
        ids, params = prepare_chat(body, engine, settings)
        return generate_request("chatcmpl", body, ids, params)

    @app.post("/v1/completions/render", responses=RENDER_RESPONSES)
    async def render_completion(body: CompletionRequest):
        prompts, params = prepare_completion(body, engine, settings)
        pairs = zip(prompts, params, strict=True)
        return [generate_request("cmpl", body, ids, plist) for ids, plist in pairs]

    @app.post("/tokenize", responses=RENDER_RESPONSES)
    async def tokenize_endpoint(body: dict):
        return tokenize(body, engine, settings)

    @app.post("/detokenize", responses=RENDER_RESPONSES)
    async def detokenize_endpoint(body: DetokenizeRequest):
        return detokenize(body, engine, settings)
