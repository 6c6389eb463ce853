"""LogitBias and Penalties build their per-request tensors once and reuse them while the request stays in
the batch: every step's logits are exactly what a fresh build gives, as the output grows, the bias changes
or the request id comes back with a new sequence."""

from __future__ import annotations

import torch

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.runner.logits_processors import LogitBias, Penalties, SampleRow

VOCAB = 11


class Seq:  # what the penalties read: the tokens generated so far
    def __init__(self, tokens: list[int]):
        self.output_token_ids = tokens


def applied(proc, rows: list[SampleRow]) -> torch.Tensor:
    logits = torch.arange(len(rows) * VOCAB, dtype=torch.float32).reshape(len(rows), VOCAB) / 7
    proc.apply(logits, rows)
    return logits


def test_penalties_extend_their_counts_and_match_a_fresh_count_every_step():
    kept = Penalties()
    params = [SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
              SamplingParams(frequency_penalty=1.0)]
    seqs = [Seq([3]), Seq([1, 1])]
    for step in range(6):
        rows = [SampleRow(f"r{i}", params[i], seqs[i]) for i in range(2)]
        assert torch.equal(applied(kept, rows), applied(Penalties(), rows)), step
        seqs[0].output_token_ids.append(step % 4)
        seqs[1].output_token_ids.append(7)
    again = SampleRow("r0", params[0], Seq([9]))  # the id again, a new sequence: counted afresh
    assert torch.equal(applied(kept, [again]), applied(Penalties(), [again]))
    kept.forget("r0")
    assert not kept._counted.get("r0")


def test_logit_bias_is_rebuilt_only_when_it_changes_and_kept_for_the_batch_only():
    kept = LogitBias()
    params = SamplingParams(logit_bias={2: 5.0, 4: -1.0})
    row = SampleRow("a", params)
    first = applied(kept, [row])
    ids = kept._built["a"][1]
    assert torch.equal(applied(kept, [row]), first) and kept._built["a"][1] is ids  # reused
    params.logit_bias[2] = -3.0  # changed in place: built again
    assert torch.equal(applied(kept, [row]), applied(LogitBias(), [row]))
    applied(kept, [SampleRow("b", SamplingParams(logit_bias={1: 1.0}))])
    assert set(kept._built) == {"b"}  # "a" left the batch
