"""Which step sizes give a row the same arithmetic in the model's linears (probed once at start-up).

A speculating row's proposals are extra decode rows of the step (engine/scheduler/speculation.py); they are
exact only where every row computes what it would in the step without them. A step's size can change a row's
rounding: torch's fp32 F.linear (MKL/oneDNN GEMM) rounds 1, 2-3 and 4+ rows differently on this CPU (probed),
and a bf16 model's linears leave the bf16-weight kernel for oneDNN past dense_above_rows (model/linear.py);
the bf16-weight kernel under an fp32 model rounds every row alike. Rather than name each library's choices,
the engine asks its own linears: sizes 1..PROBE_ROWS in classes of consecutive sizes whose rows come out
bit-identical; a step keeps its class when proposals join it."""

from __future__ import annotations

import weakref

import torch

PROBE_ROWS = 20  # past this the class of PROBE_ROWS holds (the GEMMs probed here settle by 4 rows, the
# bf16 model's kernel/oneDNN switch is at 12); the probe's cost grows with its square (~1-3 s at 20 here)


# model -> its classes (engines over one model share them)
_probed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def size_classes(model, rows: int = PROBE_ROWS) -> list[int]:
    """size_classes_of, probed once per model (its linears never change once loaded)."""
    if model not in _probed:
        _probed[model] = size_classes_of(model, rows)
    return _probed[model]


def size_classes_of(model, rows: int = PROBE_ROWS) -> list[int]:
    """classes[m] (m = 1..rows; classes[0] unused): the class of a step of m tokens; equal classes, equal
    rounding per row. Probed on the first layer's fused linears (the shapes every layer repeats) and the
    head, each over the same random rows."""
    layer = model.layers[0]
    hidden, inner = model.cfg.hidden_size, model.cfg.intermediate_size
    linears = [(layer.qkv, hidden), (layer.gate_up, hidden), (layer.down, inner), (model.lm_head, hidden)]
    gen = torch.Generator().manual_seed(0)
    classes = [0, 0]
    with torch.inference_mode():
        xs = [torch.randn(rows, k, generator=gen).to(model.dtype).to(model.device) for _, k in linears]
        prev = [lin(x[:1]) for (lin, _), x in zip(linears, xs, strict=True)]
        for m in range(2, rows + 1):
            outs = [lin(x[:m]) for (lin, _), x in zip(linears, xs, strict=True)]
            same = all(torch.equal(o[: m - 1], p) for o, p in zip(outs, prev, strict=True))
            classes.append(classes[-1] if same else classes[-1] + 1)
            prev = outs
    return classes
