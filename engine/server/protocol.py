"""OpenAI request models. Types are strict (a string is not silently an integer) and every number is
bounded to what the engine can represent: integers to their native width (a seed to 64 bits, counts to
32), floats to finite ranges where the arithmetic means something, lists and strings to sizes.

Unknown fields are rejected with a 400 that names them (OpenAI's API does the same; vLLM only logs them):
a misspelt or unsupported parameter silently dropped answers as if it had been honoured. Parameters of
OpenAI's API, and the vLLM and SGLang extensions that routers forward (vllm-router 0.1.17 and
sglang-router 0.3.2 add no_stop_trim, skip_special_tokens, separate_reasoning... to every request, at
their defaults), that this server knows but does not implement are declared here and refused by name
in engine.server.unsupported unless their value is one it serves anyway. Bounds that only the engine
knows (context length, vocabulary) are checked later. Responses are plain dicts: building a pydantic model
per streamed token would cost throughput."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from kvloop.engine.core.sampling import (
    LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    PENALTY_RANGE,
)

MAX_N = 16
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_NAME_CHARS = 256  # model, user, message names, cache keys
MAX_MESSAGES = 2048
MAX_CONTENT_PARTS = 256
MAX_STOP_TOKEN_IDS = 64
INT32_MIN = -(2**31)
Number = StrictFloat | StrictInt
Name = Annotated[StrictStr, Field(max_length=MAX_NAME_CHARS)]
Count = Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Base):
    include_usage: StrictBool = False


class ContentPart(BaseModel):
    """One part of a chat message's content. Only text parts are served; any other type (image_url,
    input_audio, file...) is refused by name in chat.py, so its own fields are let through to get there."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(_Base):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[ContentPart],
                                   Field(min_length=1, max_length=MAX_CONTENT_PARTS)] | None = None
    name: Name | None = None
    tool_call_id: Name | None = None  # role "tool": handed to the chat template
    # known to OpenAI's API, refused by name when set (engine.server.unsupported)
    tool_calls: Any = None
    function_call: Any = None
    audio: Any = None
    refusal: Any = None

    def text(self) -> str:
        """Text parts concatenated in order (chat.py has refused every other part type)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class ResponseFormat(_Base):
    """response_format: the json_schema body is checked by engine.structured.spec (its
    errors name its fields)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Sampling(_Base):
    model: Name
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None  # and 0 or >= 0.01: SamplingParams
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1, le=INT32_MAX)] | None = None  # vLLM extension
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)] | Annotated[
        list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]],
        Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]],
                              Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None  # vLLM extension
    include_stop_str_in_output: StrictBool = False  # vLLM extension
    seed: Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    safety_identifier: Name | None = None  # OpenAI's newer name for user
    presence_penalty: Annotated[Number, Field(ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])] | None = None
    frequency_penalty: Annotated[Number, Field(ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1])] | None = None
    # token id (a JSON key, so a string) -> bias added to its logit; ids checked against the vocab later
    logit_bias: Annotated[dict[Annotated[StrictStr, Field(max_length=12)],
                               Annotated[Number, Field(ge=LOGIT_BIAS_RANGE[0], le=LOGIT_BIAS_RANGE[1])]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = None
    ignore_eos: StrictBool = False  # vLLM extension (benchmarks)
    response_format: ResponseFormat | None = None  # on completions too, as vLLM accepts it
    # known to OpenAI's API, accepted only with the values this server honours (engine.server.unsupported)
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    prompt_cache_key: Name | None = None  # the prefix cache matches by content: every key is honoured
    # vLLM / SGLang extensions (engine.server.unsupported says which values are served)
    no_stop_trim: StrictBool = False  # SGLang's name for include_stop_str_in_output
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    min_tokens: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)] = 0
    return_hidden_states: StrictBool = False  # SGLang
    priority: Annotated[StrictInt, Field(ge=INT32_MIN, le=INT32_MAX)] = 0
    request_id: Name | None = None  # the response's id (vLLM); engine requests keep ids of their own
    add_special_tokens: StrictBool | None = None  # None: the endpoint default (chat false, completions true)
    min_p: Any = None
    repetition_penalty: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    return_tokens_as_token_ids: Any = None
    data_parallel_rank: Any = None


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    # known to OpenAI's API, refused by name unless empty/"none" (engine.server.unsupported)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    # vLLM / SGLang chat extensions
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    # this model has no reasoning parser: every value of these serves the same text (no reasoning_content)
    separate_reasoning: StrictBool = True  # SGLang
    stream_reasoning: StrictBool = True  # SGLang
    include_reasoning: StrictBool = True  # vLLM
    echo: Any = None  # vLLM's chat echo (the last message repeated): refused unless false
    chat_template: Any = None
    chat_template_kwargs: Any = None
    documents: Any = None
    mm_processor_kwargs: Any = None


Prompt = StrictStr | Annotated[list[StrictStr], Field(min_length=1)] | Annotated[list[StrictInt],
                                                                                 Field(min_length=1)] \
    | Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1)]


class CompletionRequest(_Sampling):
    prompt: Prompt
    max_tokens: Count | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False  # the prompt's text before each choice's (not with logprobs: no prompt logprobs)
    suffix: StrictStr | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None  # only best_of == n: no reranking


class TokenizeCompletionRequest(_Base):
    """vLLM's /tokenize body for a raw prompt."""

    model: Name | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool = False


class TokenizeChatRequest(_Base):
    """vLLM's /tokenize body for chat messages (the chat template applied, as /v1/chat/completions does);
    what vllm-router sends to learn a chat request's tokens for cache-aware routing."""

    model: Name | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False
    # known to vLLM, refused by name unless empty (engine.server.unsupported)
    tools: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    documents: Any = None
    mm_processor_kwargs: Any = None


class DetokenizeRequest(_Base):
    model: Name | None = None
    tokens: Annotated[list[Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]], Field(max_length=1 << 20)]
