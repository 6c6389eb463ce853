"""OpenAI parameters, and vLLM / SGLang extensions, that this server knows but does not implement: each is
refused with a 400 that names it, unless its value is one the server honours anyway (no tools, text only,
the default service tier, an extension at its default...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvloop.engine.server.errors import bad_request
from kvloop.engine.server.protocol import ChatCompletionRequest, CompletionRequest, TokenizeChatRequest


def _never(value: Any) -> bool:
    return False


def _empty(value: Any) -> bool:
    return value == [] or value == {}


def _number(served: float) -> Callable[[Any], bool]:
    """A JSON number equal to served (true is not 1 here)."""
    return lambda value: type(value) in (int, float) and value == served


# name -> (values honoured as they are, why the others are refused)
_REQUEST: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (_empty, "tool calling is not supported by this server; send no tools"),
    "tool_choice": (lambda v: v == "none",
                    'tool calling is not supported by this server; only "none" is accepted'),
    "parallel_tool_calls": (_never, "tool calling is not supported by this server"),
    "functions": (_empty, "function calling is not supported by this server"),
    "function_call": (lambda v: v == "none", 'function calling is not supported by this server; only "none"'),
    "audio": (_never, "audio output is not supported: this model produces text only"),
    "modalities": (lambda v: v == ["text"], 'this model produces text only: modalities must be ["text"]'),
    "prediction": (_never, "predicted outputs are not supported by this server"),
    "reasoning_effort": (_never, "this model has no reasoning mode"),
    "verbosity": (_never, "this model has no verbosity setting"),
    "web_search_options": (_never, "web search is not supported by this server"),
    "service_tier": (lambda v: v in ("auto", "default"),
                     'this server has one service tier: "auto" or "default"'),
    "store": (lambda v: v is False, "this server does not store completions; store must be false"),
    "metadata": (_never, "metadata is only used with store, which this server does not support"),
    # vLLM / SGLang extensions: each at its default (what the routers forward) is served as it is
    "skip_special_tokens": (lambda v: v is True, "special tokens are always left out of the text: send true"),
    "spaces_between_special_tokens": (lambda v: v is True, "special tokens are always left out of the text: "
                                      "send true"),
    "return_hidden_states": (lambda v: v is False, "hidden states are not returned by this server"),
    "priority": (lambda v: v == 0, "request priorities are not supported by this server (its queue orders by "
                 "arrival and the SLO); send 0"),
    "min_p": (_number(0), "min_p is not supported by this server; send 0"),
    "repetition_penalty": (_number(1), "repetition_penalty is not supported by this server (use "
                           "presence_penalty or frequency_penalty); send 1"),
    "use_beam_search": (lambda v: v is False, "beam search is not supported by this server"),
    "length_penalty": (_number(1), "length_penalty applies to beam search, which this server does not "
                       "support; send 1"),
    "truncate_prompt_tokens": (_never, "prompts are never truncated by this server"),
    "prompt_logprobs": (_never, "prompt logprobs are not computed by this server"),
    "allowed_token_ids": (_never, "allowed_token_ids is not supported by this server (logit_bias is)"),
    "bad_words": (_empty, "bad_words is not supported by this server"),
    "cache_salt": (_never, "cache_salt is not supported: the prefix cache is shared by content"),
    "kv_transfer_params": (_never, "KV transfer between servers is not driven by request parameters here"),
    "return_tokens_as_token_ids": (lambda v: v is False, "tokens are returned as text by this server"),
    "data_parallel_rank": (_never, "this server has no data-parallel ranks to choose"),
}
_CHAT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "echo": (lambda v: v is False, "chat echo is not supported by this server"),
    "continue_final_message": (lambda v: v is False, "continuing the final message is not supported by this "
                               "server yet; send false"),
    "chat_template": (_never, "this server serves its model's own chat template only"),
    "chat_template_kwargs": (_empty, "this model's chat template takes no arguments"),
    "documents": (_empty, "documents are not supported by this model's chat template"),
    "mm_processor_kwargs": (_empty, "this model reads text only"),
}
_COMPLETION: dict[str, tuple[Callable[[Any], bool], str]] = {
    "suffix": (lambda v: v == "", "suffix (insertion) is not supported by this server"),
}
_TOKENIZE_CHAT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": _REQUEST["tools"],
    **{k: _CHAT[k] for k in ("continue_final_message", "chat_template", "chat_template_kwargs", "documents",
                             "mm_processor_kwargs")},
}
_MESSAGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tool_calls": (_empty, "tool calling is not supported by this server"),
    "function_call": (_never, "function calling is not supported by this server"),
    "audio": (_never, "audio is not supported: this model reads text only"),
    "refusal": (_never, "refusal messages are not supported; send the text as content"),
}


def check_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    _check(req, _REQUEST, "")
    if isinstance(req, CompletionRequest):
        _check(req, _COMPLETION, "")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request(f"best_of must equal n ({req.n}): choices are not reranked by this server",
                              "best_of")
        if req.echo and req.logprobs is not None:
            raise bad_request("echo with logprobs needs the prompt's logprobs, which this server does not "
                              "compute; send echo false or no logprobs", "echo")
    if isinstance(req, ChatCompletionRequest):
        _check(req, _CHAT, "")
        if req.continue_final_message and req.add_generation_prompt:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true",
                              "continue_final_message")
        _check_messages(req)


def _check_messages(req: ChatCompletionRequest | TokenizeChatRequest) -> None:
    for i, message in enumerate(req.messages):
        _check(message, _MESSAGE, f"messages[{i}].")
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            param = f"messages[{i}].content[{j}]"
            if part.type != "text":
                raise bad_request(f"{param}.type: {part.type!r} content is not supported: this model "
                                  "reads text only; send text parts", f"{param}.type")
            if part.text is None or set(part.model_extra or {}):
                raise bad_request(f"{param}: a text part has exactly the fields type and text", param)


def check_tokenize_chat(req: TokenizeChatRequest) -> None:
    _check(req, _TOKENIZE_CHAT, "")
    _check_messages(req)


def _check(obj: Any, table: dict[str, tuple[Callable[[Any], bool], str]], prefix: str) -> None:
    for name, (honoured, why) in table.items():
        value = getattr(obj, name, None)
        if value is not None and not honoured(value):
            raise bad_request(f"{prefix}{name}: {why}", f"{prefix}{name}")
