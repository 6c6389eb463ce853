"""OpenAI request models. Types are strict (a string is not silently an integer), unknown fields are
ignored as OpenAI's own API does, and bounds that only the engine knows (context length) are checked
later. Responses are plain dicts: building a pydantic model per streamed token would cost throughput."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

MAX_N = 16
Number = StrictFloat | StrictInt


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Base):
    include_usage: StrictBool = False


class TextPart(_Base):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[TextPart], Field(min_length=1)] | None = None
    name: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _Sampling(_Base):
    model: StrictStr
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None  # vLLM extension
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    seed: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: Annotated[StrictStr, Field(max_length=256)] | None = None
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    ignore_eos: StrictBool = False  # vLLM extension (benchmarks)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None


Prompt = StrictStr | Annotated[list[StrictStr], Field(min_length=1)] | Annotated[list[StrictInt], Field(min_length=1)] \
    | Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)]


class CompletionRequest(_Sampling):
    prompt: Prompt
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None
