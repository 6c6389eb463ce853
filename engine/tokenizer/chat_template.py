"""Renders a model's Jinja chat template the way Hugging Face does (sandboxed, trim/lstrip blocks)."""

from __future__ import annotations

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used only when a model ships no template: ChatML, the format of SmolLM2 and Qwen2.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.source = source or CHATML
        self._template = env.from_string(self.source)
        self._bos, self._eos = bos_token, eos_token

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._bos,
            eos_token=self._eos,
        )
