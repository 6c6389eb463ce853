"""What chat and completions share: model check, sampling parameters, prompt checks, submitting the
engine requests of one API call, and waiting on them with client-disconnect and deadline handling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvloop.engine.core.grammar_spec import GrammarSpec, parse_response_format
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import TokenLogprob
from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.scheduler.scheduler import RequestRejected
from kvloop.engine.server.async_engine import AsyncEngine, EngineDead, Overloaded, RequestFailed, RequestGroup
from kvloop.engine.server.errors import APIError, bad_request, error_body, param_of
from kvloop.engine.server.protocol import _Sampling
from kvloop.engine.structured.compiler import compiler_for

MAX_CHOICES = 64  # prompts x n in one call


class ClientGone(Exception):
    """The client disconnected; its requests were aborted."""


@dataclass
class ServerSettings:
    request_timeout_s: float | None = None  # per-request deadline; None: no deadline
    retry_after_s: int = 1
    served_names: tuple[str, ...] = ("default",)


def check_model(engine: AsyncEngine, settings: ServerSettings, name: str) -> None:
    if name != engine.model_name and name not in settings.served_names:
        raise APIError(404,
                       f"The model `{name}` does not exist. Served: {engine.model_name!r} (alias 'default').",
                       "model", "model_not_found")


def check_unicode(text: str, param: str) -> None:
    """A lone surrogate (valid JSON, not valid Unicode text) is the client's error, not ours."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"{param} is not valid Unicode text: {exc.reason} at position {exc.start}",
                          param) from exc


def encode(engine: AsyncEngine, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
    """A raw prompt: special-token strings in it are the control tokens they name, as in vLLM.
    add_special_tokens (vLLM's, default true) adds what the model's tokenizer adds to a text (its BOS);
    false leaves the text's own tokens only."""
    check_unicode(text, param)
    if add_special_tokens:
        return engine.tokenizer.encode(text)
    return engine.tokenizer.backend.encode(text, add_special_tokens=False).ids


def check_prompt(engine: AsyncEngine, ids: list[int], max_tokens: int | None, param: str) -> int:
    """Returns the effective max_tokens (the rest of the context when not given)."""
    limit = engine.max_model_len
    if not ids:
        raise bad_request("the prompt is empty", param)
    vocab = engine.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", param)
    if max_tokens is None:
        if len(ids) >= limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens, but the prompt has "
                              f"{len(ids)} tokens.", param)
        return limit - len(ids)
    if len(ids) + max_tokens > limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                          "completion). Please reduce the prompt or max_tokens.", param)
    return max_tokens


def sampling_params(req: _Sampling, max_tokens: int, logprobs: int | None, choice: int,
                    logit_bias: dict[int, float] | None = None,
                    grammar: GrammarSpec | None = None) -> SamplingParams:
    seed = None if req.seed is None else req.seed + choice  # n choices with one seed still differ
    try:
        return SamplingParams(max_tokens=max_tokens,
                              temperature=1.0 if req.temperature is None else req.temperature,
                              top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0, seed=seed,
                              stop=req.stop or [], stop_token_ids=req.stop_token_ids or [],
                              # SGLang's no_stop_trim is the same promise: the stop string stays
                              include_stop_str_in_output=req.include_stop_str_in_output or req.no_stop_trim,
                              ignore_eos=req.ignore_eos,
                              min_tokens=req.min_tokens,
                              logprobs=logprobs, presence_penalty=req.presence_penalty or 0.0,
                              frequency_penalty=req.frequency_penalty or 0.0, logit_bias=logit_bias or {},
                              grammar=grammar)
    except ValueError as exc:
        raise bad_request(str(exc), param_of(str(exc))) from exc


def logit_bias_of(engine: AsyncEngine, req: _Sampling) -> dict[int, float]:
    """JSON object keys are strings: each must be a token id of this model's vocabulary."""
    out: dict[int, float] = {}
    vocab = engine.vocab_size
    for key, bias in (req.logit_bias or {}).items():
        token = int(key) if key.isascii() and key.isdecimal() else -1
        if not 0 <= token < vocab:
            raise bad_request(f"logit_bias keys must be token ids in [0, {vocab}), got {key!r}", "logit_bias")
        out[token] = float(bias)
    return out


def grammar_of(engine: AsyncEngine, req: _Sampling) -> GrammarSpec | None:
    """response_format as a grammar spec, compiled here once (then cached for the engine) so that an invalid
    schema, or one the grammar library cannot handle, is a 400 naming response_format."""
    if req.response_format is None:
        return None
    try:
        spec = parse_response_format(req.response_format.model_dump(exclude_none=True))
        if spec is not None:
            compiler_for(engine.tokenizer, engine.vocab_size).compile(spec)
    except ValueError as exc:
        message = str(exc)
        raise bad_request(message if message.startswith("response_format") else f"response_format: {message}",
                          "response_format") from exc
    return spec


def user_of(req: _Sampling) -> str | None:
    """The fairness key: user, or safety_identifier, OpenAI's newer name for it."""
    return req.user if req.user is not None else req.safety_identifier


def to_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestRejected) and exc.reason == "queue_full" or isinstance(exc, Overloaded):
        return APIError(429, f"the server is overloaded, retry later ({exc})", code="queue_full",
                        headers={"Retry-After": "1"})
    if isinstance(exc, EngineDead):
        return APIError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, RequestFailed) and exc.stage in (None, "step"):  # out of memory, a failed model step
        return APIError(503, f"the engine could not serve this request: {exc}", code="engine_error",
                        headers={"Retry-After": "1"})
    if isinstance(exc, RequestFailed):  # this request alone failed inside the engine; the server goes on
        return APIError(500, f"the engine failed this request: {exc}", code="request_failed")
    if isinstance(exc, ValueError):
        return bad_request(str(exc), "prompt" if isinstance(exc, RequestRejected) else param_of(str(exc)))
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


@dataclass
class Call:
    """One API call: its engine requests, and which choice index each one is."""

    engine: AsyncEngine
    settings: ServerSettings
    request: Request
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    response_id: str | None = None  # the client's request_id (vLLM's extension); engine ids stay self.id's
    created: int = field(default_factory=lambda: int(time.time()))
    index: dict[str, int] = field(default_factory=dict)
    prompt_of: dict[str, int] = field(default_factory=dict)
    group: RequestGroup | None = None
    logprobs: dict[str, list[tuple[int, TokenLogprob]]] = field(default_factory=dict)
    _listener: asyncio.Task | None = None
    _deadline: float | None = None

    def submit(self, prompts: list[list[int]], params: list[list[SamplingParams]], user: str | None) -> None:
        total = sum(len(p) for p in params)
        if total > MAX_CHOICES:
            raise bad_request(f"at most {MAX_CHOICES} choices (prompts x n) per request, got {total}", "n")
        if self.engine.draining:  # TERM: another replica should take it
            raise APIError(503, "the server is shutting down, retry on another replica", code="shutting_down",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        if not self.engine.ready:
            raise APIError(503, "the engine is not ready", code="not_ready")
        try:
            self.engine.check_capacity(total)
            self.group = self.engine.new_group()
        except (Overloaded, EngineDead) as exc:
            raise to_api_error(exc) from exc
        for p, (ids, plist) in enumerate(zip(prompts, params, strict=True)):
            for c, sp in enumerate(plist):
                rid = f"{self.id}-{p}-{c}"
                self.index[rid], self.prompt_of[rid] = p * len(plist) + c, p
                self.group.add(rid, ids, sp, user)
        if self.settings.request_timeout_s:
            self._deadline = time.monotonic() + self.settings.request_timeout_s
        self._listener = asyncio.create_task(self._listen())

    async def _listen(self) -> None:
        while True:
            message = await self.request.receive()
            if message["type"] == "http.disconnect":
                if self.group is not None and self.group.unfinished:
                    self.group.close()
                    self.group.queue.put_nowait(("", ClientGone()))
                return

    async def next(self) -> tuple[str, RequestOutput]:
        """The next output of any member; raises APIError (engine rejection, deadline) or ClientGone."""
        timeout = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            async with asyncio.timeout(timeout):
                rid, item = await self.group.next()
        except TimeoutError:
            raise APIError(408,
                           f"the request exceeded the server's deadline of {self.settings.request_timeout_s} "
                           "s",
                           code="timeout") from None
        if isinstance(item, ClientGone):
            raise item
        if isinstance(item, BaseException):
            error = to_api_error(item)
            error.request_id = rid  # a stream marks that choice finish_reason "error"
            raise error
        return rid, item

    @property
    def public_id(self) -> str:
        """The id the response shows: the client's request_id when it sent one."""
        return self.response_id or self.id

    @property
    def unfinished(self) -> bool:
        return bool(self.group and self.group.unfinished)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self._listener is not None:
            self._listener.cancel()

    async def collect(self, first: tuple[str, RequestOutput]) -> dict[str, RequestOutput]:
        """Waits for every member to finish (non-streaming); the final outputs by request id. Sampled
        (token id, logprob) pairs accumulate in self.logprobs, since each output carries only new ones."""
        final: dict[str, RequestOutput] = {}
        try:
            rid, out = first
            while True:
                if out.new_logprobs:
                    self.logprobs.setdefault(rid, []).extend(zip(out.new_token_ids, out.new_logprobs,
                                                                 strict=False))
                if out.finished:
                    final[rid] = out
                if not self.unfinished:
                    return final
                rid, out = await self.next()
        finally:
            self.close()

    async def stream(self, first: tuple[str, RequestOutput]) -> AsyncIterator[tuple[str, RequestOutput]]:
        try:
            yield first
            while self.unfinished:
                yield await self.next()
        finally:
            self.close()


async def first_output(call: Call) -> tuple[str, RequestOutput]:
    """Before a stream starts, so that rejections still get a proper status code."""
    try:
        return await call.next()
    except BaseException:
        call.close()
        raise


async def respond(call: Call, req: _Sampling, stream) -> Response | list[RequestOutput]:
    """Shared by chat and completions: waits for the first output, then either returns the SSE response
    (`stream(call, req, first, include_usage)` makes its body, with sse_events) or the finished outputs in
    choice order. A client gone before that gets a bare 499."""
    try:
        first = await first_output(call)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(stream(call, req, first, include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finals = await call.collect(first)
    except ClientGone:
        return JSONResponse({}, status_code=499)
    return sorted(finals.values(), key=lambda o: call.index[o.request_id])


def json_logprob(value: float) -> float:
    """JSON has no -inf: a token with no probability at all reads -9999.0, as OpenAI's and vLLM's APIs do."""
    return value if math.isfinite(value) else -9999.0


def sse(data: str) -> str:
    return f"data: {data}\n\n"


async def sse_events(call: Call, first: tuple[str, RequestOutput], head: dict, include_usage: bool,
                     choices_of: Callable[[str, RequestOutput], Iterable[dict]],
                     failed_choice: Callable[[int], dict],
                     opening: Iterable[dict] = ()) -> AsyncIterator[str]:
    """The SSE body of a streamed chat or completions call, one chunk (head + one choice) per event: the
    opening choices, then choices_of(request id, output) for each output. The tail is the same for both
    endpoints: on an engine error the failed choice's failed_choice(index) chunk (finish_reason "error")
    and the error event in the OpenAI error shape; else the usage chunk when asked for; then [DONE], so
    that clients reading to it stop cleanly. A client gone ends the body silently."""
    extra = {"usage": None} if include_usage else {}

    def event(choice: dict) -> str:
        return sse(json.dumps({**head, "choices": [choice], **extra}, ensure_ascii=False))

    for choice in opening:
        yield event(choice)
    finals: list[RequestOutput] = []
    try:
        async for rid, out in call.stream(first):
            for choice in choices_of(rid, out):
                yield event(choice)
            if out.finished:
                finals.append(out)
    except ClientGone:
        return
    except APIError as exc:
        if exc.request_id in call.index:
            yield event(failed_choice(call.index[exc.request_id]))
        yield sse(json.dumps(error_body(exc.status, exc.message, exc.param, exc.code))) + sse("[DONE]")
        return
    if include_usage:
        yield sse(json.dumps({**head, "choices": [], "usage": usage(finals, call.prompt_of)}))
    yield sse("[DONE]")


def usage(finals: list[RequestOutput], prompt_of: dict[str, int]) -> dict:
    """prompt tokens once per distinct prompt (n choices share it), completion tokens over all choices."""
    prompt: dict[int, int] = {}
    cached: dict[int, int] = {}
    for out in finals:
        p = prompt_of.get(out.request_id, 0)
        prompt[p] = out.num_prompt_tokens
        cached[p] = max(cached.get(p, 0), out.num_cached_tokens)
    completion = sum(o.num_output_tokens for o in finals)
    total_prompt = sum(prompt.values())
    return {"prompt_tokens": total_prompt, "completion_tokens": completion,
            "total_tokens": total_prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}


@contextlib.contextmanager
def api_errors():
    """Maps engine-side exceptions raised while preparing a call to API errors."""
    try:
        yield
    except (APIError, ClientGone):
        raise
    except (ValueError, Overloaded, EngineDead) as exc:
        raise to_api_error(exc) from exc
