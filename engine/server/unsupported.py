"""OpenAI parameters this server knows but does not implement: each is refused with a 400 that names it,
unless its value is one the server honours anyway (no tools, text only, the default service tier...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvloop.engine.server.errors import bad_request
from kvloop.engine.server.protocol import ChatCompletionRequest, CompletionRequest


def _never(value: Any) -> bool:
    return False


def _empty(value: Any) -> bool:
    return value == [] or value == {}


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
    "echo": (lambda v: v is False, "echo is not supported by this server"),
    "suffix": (lambda v: v == "", "suffix (insertion) is not supported by this server"),
}
_MESSAGE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tool_calls": (_empty, "tool calling is not supported by this server"),
    "function_call": (_never, "function calling is not supported by this server"),
    "audio": (_never, "audio is not supported: this model reads text only"),
    "refusal": (_never, "refusal messages are not supported; send the text as content"),
}


def check_unsupported(req: ChatCompletionRequest | CompletionRequest) -> None:
    _check(req, _REQUEST, "")
    if isinstance(req, CompletionRequest) and req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of must equal n ({req.n}): choices are not reranked by this server",
                          "best_of")
    if isinstance(req, ChatCompletionRequest):
        for i, message in enumerate(req.messages):
            _check(message, _MESSAGE, f"messages[{i}].")
            for j, part in enumerate(message.content if isinstance(message.content, list) else []):
                param = f"messages[{i}].content[{j}]"
                if part.type != "text":
                    raise bad_request(f"{param}.type: {part.type!r} content is not supported: this model "
                                      "reads text only; send text parts", f"{param}.type")
                if part.text is None or set(part.model_extra or {}):
                    raise bad_request(f"{param}: a text part has exactly the fields type and text", param)


def _check(obj: Any, table: dict[str, tuple[Callable[[Any], bool], str]], prefix: str) -> None:
    for name, (honoured, why) in table.items():
        value = getattr(obj, name, None)
        if value is not None and not honoured(value):
            raise bad_request(f"{prefix}{name}: {why}", f"{prefix}{name}")
