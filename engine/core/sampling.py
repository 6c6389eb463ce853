"""Per-request sampling parameters (no torch). Validation errors are ValueError with a clear message;
the API turns them into 400 responses."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvloop.engine.core.grammar_spec import GrammarSpec

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # per stop string: the output processor re-searches this much text on every token
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # entries, OpenAI's own limit
LOGIT_BIAS_RANGE = (-100.0, 100.0)
PENALTY_RANGE = (-2.0, 2.0)
# torch.Generator.manual_seed takes [-2**63, 2**64): anything else raised inside the engine step
SEED_RANGE = (-(2**63), 2**64 - 1)
# Below this (but above 0, which is greedy) logits/temperature leaves float32's range for ordinary logits
# (|logit| ~ 1e2 overflows past ~1e-36) and, long before that, softmax is one-hot to float32 precision:
# the sample is the greedy token. 0.01 is where vLLM clamps too; here it is a clear error instead.
MIN_TEMPERATURE = 0.01


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top alternatives to return with each sampled token
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    grammar: GrammarSpec | None = None  # response_format's constraint (engine/structured)
    # output tokens before EOS or a stop token id may be sampled, or a stop string end the request (vLLM's)
    min_tokens: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check_int("max_tokens", self.max_tokens, 1)
        _check_number("temperature", self.temperature, 0.0, 2.0)
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and 2, got "
                             f"{self.temperature}")
        _check_number("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise ValueError("top_p must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            raise ValueError("top_k must be an integer >= -1 (0 or -1 disables it)")
        if self.seed is not None:
            _check_int("seed", self.seed, *SEED_RANGE)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters long")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        _check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        _check_number("presence_penalty", self.presence_penalty, *PENALTY_RANGE)
        _check_number("frequency_penalty", self.frequency_penalty, *PENALTY_RANGE)
        self.logit_bias = dict(self.logit_bias or {})
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias may have at most {MAX_LOGIT_BIAS} entries, got "
                             f"{len(self.logit_bias)}")
        for token, bias in self.logit_bias.items():
            _check_int("logit_bias", token, 0, 2**31 - 1)  # token ids; the engine checks its vocab
            _check_number("logit_bias", bias, *LOGIT_BIAS_RANGE)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_number(name: str, value, low: float, high: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise ValueError(f"{name} must be a number")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
