"""Hugging Face transformers `generate` as a peer: whatever batch it is given runs to completion (put a
StaticBatchGate in front for static batching). Greedy, no EOS stop; per-step times come from a
stopping criterion that only records the clock, so token timing is as the client would see it."""

from __future__ import annotations

import time

from kvloop.engine.bench.targets.base import Event, Target


def load_embedded(dtype: str = "float32"):
    """The embedded SmolLM2 GGUF through transformers' GGUF loader (dequantised to `dtype`)."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    from kvloop.engine.model.locate import embedded_model_path

    path = str(embedded_model_path())
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 torch_dtype=getattr(torch, dtype))
    return model.eval()


class HFGenerateTarget(Target):
    def __init__(self, model, name: str = "transformers-static", pad_token_id: int = 0):
        self.model = model
        self.name = name
        self.pad = pad_token_id
        self._queue: list[tuple[str, list[int], int]] = []

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self._queue.append((request_id, prompt, max_tokens))

    def poll(self, timeout: float) -> list[Event]:
        if not self._queue:
            if timeout > 0:
                time.sleep(timeout)
            return []
        batch, self._queue = self._queue, []
        return self._generate(batch)

    def _generate(self, batch: list[tuple[str, list[int], int]]) -> list[Event]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        stamps: list[float] = []

        class Clock(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                stamps.append(time.monotonic())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        width = max(len(p) for _, p, _ in batch)
        ids = torch.full((len(batch), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (_, p, _) in enumerate(batch):  # left padding, as decoder-only generation needs
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        n = max(m for _, _, m in batch)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=self.pad, eos_token_id=None,
                                      stopping_criteria=StoppingCriteriaList([Clock()]))
        events = []
        for i, (rid, p, m) in enumerate(batch):
            toks = out[i, width:width + m].tolist()
            for k in range(min(m, len(stamps))):
                events.append(Event(rid, stamps[k], [toks[k]] if k < len(toks) else [], 1))
            events.append(Event(rid, stamps[min(m, len(stamps)) - 1], done=True, prompt_tokens=len(p),
                                output_tokens=min(m, len(stamps))))
        return events

    def idle(self) -> bool:
        return not self._queue

    def info(self) -> dict:
        return {"dtype": str(self.model.dtype).removeprefix("torch."), "impl": "transformers generate"}
