"""The in-process engine as a target: submit = add_request, poll = one engine step."""

from __future__ import annotations

import time

from kvloop.engine.bench.targets.base import Event, Target
from kvloop.engine.core.snapshot import EngineSnapshot


class EngineTarget(Target):
    def __init__(self, engine, name: str = "engine"):
        self.engine = engine  # an EngineCore
        self.name = name
        self._pending: list[Event] = []
        self._live: set[str] = set()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        from kvloop.engine.core.sampling import SamplingParams
        from kvloop.engine.scheduler.scheduler import RequestRejected

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        try:
            self.engine.add_request(request_id, prompt, params)
            self._live.add(request_id)
        except RequestRejected as e:  # refused before running: a rejection, not a crash
            self._pending.append(Event(request_id, time.monotonic(), done=True, prompt_tokens=len(prompt),
                                       error=f"rejected: {e.reason}: {e}"))

    def poll(self, timeout: float) -> list[Event]:
        out, self._pending = self._pending, []
        if not self.engine.has_unfinished():
            if not out and timeout > 0:
                time.sleep(timeout)
            return out
        outputs = self.engine.step()
        t = time.monotonic()
        for o in outputs:
            ev = Event(o.request_id, t, list(o.new_token_ids), len(o.new_token_ids), o.finished,
                       o.num_prompt_tokens, o.num_cached_tokens, o.num_output_tokens, o.error)
            if o.finished:
                self._live.discard(o.request_id)
                if o.finish_reason not in ("length", "stop"):
                    ev.error = ev.error or f"finished: {o.finish_reason}"
            out.append(ev)
        return out

    def idle(self) -> bool:
        return not self._live and not self._pending

    def snapshot(self) -> EngineSnapshot:
        return self.engine.snapshot()

    def info(self) -> dict:
        e = self.engine
        return {"dtype": str(e.dtype).removeprefix("torch."), "model": e.model_name,
                "kv_cache_tokens": e.config.kv_cache_tokens, "block_size": e.config.block_size,
                "max_num_seqs": e.config.scheduler.max_num_seqs,
                "max_num_batched_tokens": e.config.scheduler.max_num_batched_tokens,
                "kv_mode": e.config.kv.mode}
