"""The target interface the driver uses (pure Python)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvloop.engine.core.snapshot import EngineSnapshot


@dataclass
class Event:
    """Tokens streamed for a request, or its end. `t` is time.monotonic() when the client saw it."""

    request_id: str
    t: float
    new_token_ids: list[int] = field(default_factory=list)
    num_new_tokens: int = 0  # may exceed len(new_token_ids) where a target does not return ids
    done: bool = False
    prompt_tokens: int = 0
    cached_tokens: int | None = 0  # None: the server did not report it
    output_tokens: int = 0
    error: str | None = None


class Target:
    """submit() starts a request; poll() makes progress and returns what happened, waiting at most
    `timeout` seconds when nothing is ready; snapshot() returns the server's engine snapshot (or None)."""

    name = "target"

    def start(self) -> None:
        pass

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        raise NotImplementedError

    def poll(self, timeout: float) -> list[Event]:
        raise NotImplementedError

    def idle(self) -> bool:
        """Nothing submitted is unfinished."""
        raise NotImplementedError

    def snapshot(self) -> EngineSnapshot | None:
        return None

    def info(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def now() -> float:
    return time.monotonic()
