"""The model's step through torch.compile (inductor's C++ backend on the CPU): norms, rotary, residuals and
the MLP's elementwise ops fused into a few generated loops, around the linear kernels and attention.

What varies per step stays outside the graph. The graph's inputs are the step's token ids and positions
([N], N dynamic); each layer's attention (K/V write, paged attention over the step's metadata) is one
opaque operator, kvloop_step::attention, that reads the metadata and the KV cache from the step being run
(bound by CompiledStep.__call__), as vLLM's piecewise graphs do. So a new batch size, context length,
block table or cascade plan never recompiles: there is one graph for every N (N = 1 included, so a row's
arithmetic does not depend on the batch it is in), or, for a bf16 model with the bf16-weight kernel built
without bf16 pairs (model/linear.py), one for steps of up to 12 tokens and one for larger steps
(CompiledStep's docstring). The operator's kernel is Python (step_attention: the
model's bound attention), except where the backend's library serves the step itself: the CPU attention
kernel's library has a C++ kernel for CPU tensors that runs a bound decode-only step's layer without a call
back into Python (bound per step through the LayerFn's `native_step`) and otherwise calls the Python one.

Compiling happens in `warm_up` (the engine's start-up), over a scratch KV cache of one block; afterwards a
step that would need another graph runs eagerly rather than compiling on a user's request. With the
checkpoint's fingerprint (an engine over a loaded checkpoint) the step is compiled ahead of time
(`aot_compile`) and saved (runner/step_artefact.py: keyed by the model and all the compiled code depends on),
and a later start loads it rather than having dynamo trace the layers again. The saved graph was traced with
N unbacked, so loaded it serves every N as well; __call__ checks its guards and runs a step they reject
eagerly. Without a fingerprint (a model built in-process) or with $KVLOOP_COMPILED_STEP_CACHE=off,
torch.compile's own path traces at warm-up, its artefacts in inductor's caches (under cache_dir()).

Where a warm start-up goes (embedded SmolLM2, --dtype auto: bf16 weights, fp32 arithmetic, 2 threads, on 2
cores shared with other work at load ~3, so rough; EngineCore built in a fresh process): import torch 3.6-4.1
s, kvloop 0.6 s, then the EngineCore 8.4-9.5 s: model and tokenizer 1.1-1.6 s (converted weights read from
model/weight_cache.py's cache), importing dynamo and inductor ~3 s, loading the saved step and running the
warm-up steps 3.7-4.4 s (tracing the layers and inductor's cache hits took warm_up 12.4-15.5 s before);
12.6-14.3 s in all. The saved step is ~1.4 MB. Its cost: AOT compiling bypasses inductor's FX graph cache
(torch does so in AOT mode), so a start whose key changed (the first, another checkpoint, a new torch, an edit
to the model's or this module's sources) pays inductor's whole code generation once: warm_up 68-74 s here (its
C++ builds still come from its cache), against ~15 s through torch.compile's own path with its caches warm."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import types
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from kvloop.engine.core.cache_root import cache_root
from kvloop.engine.kernels.attention_meta import AttentionMetadata, PrefillChunk
from kvloop.engine.kernels.backend import LayerFn
from kvloop.engine.model.linear import dense_above_rows, dense_graph
from kvloop.engine.runner import step_artefact

log = logging.getLogger("kvloop.compile")

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_USER_CACHE_DIR = os.environ.get(CACHE_ENV)  # read before torch does: importing inductor sets its own default
# Our ops' outputs are fresh contiguous tensors (the fakes say so), so the wrapper's per-call size and
# alignment checks only cost time. The C++ wrapper (cpp_wrapper): the graph's own calls (~10 ops and buffers a
# layer) leave Python; a batch-1 int8 step 14.48 against 15.12 ms (medians of 3 runs each, interleaved, this
# 2-core VM), its cold compile ~50 s (the saved step loads in ~5 s either way).
INDUCTOR_OPTIONS = {"size_asserts": False, "alignment_asserts": False, "cpp_wrapper": True}


class _Bound(threading.local):
    attend: LayerFn | None = None  # the model's attention bound to the step's metadata and KV cache


_bound = _Bound()  # the step being run: what the attention operator reads


def step_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer `layer` of the bound step: writes k, v into its pages and attends q over them. Mutates only the
    bound KV cache, which is not a graph input: the graph orders it by data (the output feeds the next op).
    The operator's Python kernel; a step bound in C++ (the LayerFn's `native_step`) never reaches it."""
    out = _bound.attend(layer, q, k, v)
    return out if out.is_contiguous() else out.contiguous()


def _attention_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    return q.new_empty(q.shape)


# A plain library operator rather than torch.library.custom_op: a third of its dispatch cost per call
# (measured ~7 vs ~20 us), and the step calls it once per layer. Every device: the bound
# model runs wherever it lives.
_LIB = torch.library.Library("kvloop_step", "DEF")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, int layer) -> Tensor")
_LIB.impl("attention", step_attention, "CompositeExplicitAutograd")
torch.library.register_fake("kvloop_step::attention", _attention_shape, lib=_LIB)


def _attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.ops.kvloop_step.attention(q, k, v, layer)


def cache_dir() -> Path:
    """Where compiled artefacts live: $TORCHINDUCTOR_CACHE_DIR when the user set it,
    else under cache_root()."""
    return Path(_USER_CACHE_DIR) if _USER_CACHE_DIR else cache_root() / "inductor"


def compiler_missing() -> str | None:
    """Why inductor's C++ backend cannot run here, or None."""
    import torch._inductor.config as inductor_config

    cxx = os.environ.get("CXX") or next((c for c in inductor_config.cpp.cxx if c), "g++")
    return None if shutil.which(cxx) else f"no C++ compiler ({cxx}) on PATH"


def keep_guard(entries) -> list[bool]:
    """Which of dynamo's guards the step keeps: those on its inputs (ids, positions) and on global state (grad
    mode, default device, ...). The ~1,270 on the model's objects and weights took 1.1 ms of a batch-1 step
    (24 ms; measured) and guard nothing that changes: a CompiledStep serves one model, fixed once loaded,
    through a code object of its own (so no other model's graph can match)."""
    return [not e.name or e.name.split(".")[0].split("[")[0] in _INPUTS for e in entries]


_INPUTS = ("input_ids", "positions")


def _own_code(fn: Callable) -> Callable:
    """fn with a copy of its code object: dynamo keeps compiled graphs per code object, so this function's
    cache holds only what it compiles (two models' steps never share entries)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)


class _Graph:
    """One graph of the step: its own copy of the step's code (so its own dynamo cache), torch.compile's
    function, the ahead-of-time graph once compiled or loaded (with an artefact), and which
    weights its bf16 linears read
    (`dense`: None where the model's linears have one path, model/linear.dense_graph)."""

    def __init__(self, layers_forward: Callable, artefact: Path | None, dense: bool | None):
        def layers(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return layers_forward(input_ids, positions, _attend)

        self.layers = _own_code(layers)
        self.compiled = torch.compile(self.layers, dynamic=False, fullgraph=True,
                                      options={**INDUCTOR_OPTIONS, "guard_filter_fn": keep_guard})
        self.artefact = artefact
        self.dense = dense
        self.aot = None  # torch's AOTCompiledFunction, once warm_up compiled or loaded it (with an artefact)
        self.loaded = False

    def weights(self):
        """The context its tracing and runs take place in: the bf16 linears' branch this graph holds."""
        return nullcontext() if self.dense is None else dense_graph(self.dense)


class CompiledStep:
    """model.layers_forward compiled (or loaded as an earlier start compiled it, from `artefact`): call it
    like model.forward (ids, positions, metadata, KV cache).

    One graph serves every step, except for a bf16 model whose linears keep the bf16-weight kernel's packed
    weights and a dense copy (model/linear.py): steps of up to `dense_above` tokens run a graph whose linears
    take the kernel (decode-sized steps, bound by the bytes of weights they read), larger ones a graph whose
    linears are plain F.linear over the dense copy, which inductor prepacks for oneDNN's GEMM. Each graph is
    compiled (and saved) on its own; both serve any number of tokens, so a step goes to one by its size."""

    def __init__(self, model, artefact: Path | None = None):
        self.model = model
        self.artefact = artefact  # where the compiled step is saved for the next start; None: not saved
        self.warm = False
        self.warm_up_seconds: float | None = None
        # what a step whose inputs the graph's guards reject does once warm: run eagerly, never compile on a
        # user's request (tests set "fail_on_recompile" to prove that no step needs another graph)
        self.stance_when_warm = "eager_on_recompile"
        self._ran_eagerly = False
        layers_forward = model.layers_forward  # one bound method: the saved step names it (external data)
        self._external = {"layers_forward": layers_forward}
        self.dense_above = dense_above_rows(model)  # None: one graph
        if self.dense_above is None:
            self._graphs = [_Graph(layers_forward, artefact, None)]
        else:
            dense_artefact = (None if artefact is None
                              else artefact.with_name(f"{artefact.stem}-dense{artefact.suffix}"))
            self._graphs = [_Graph(layers_forward, artefact, False),
                            _Graph(layers_forward, dense_artefact, True)]

    @property
    def loaded(self) -> bool:
        """warm_up loaded every graph from its artefact (rather than compiling it)."""
        return all(g.loaded for g in self._graphs)

    def _graph_for(self, input_ids: torch.Tensor) -> _Graph:
        dense = self.dense_above is not None and input_ids.shape[0] > self.dense_above
        return self._graphs[1 if dense else 0]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 kv_cache: torch.Tensor) -> torch.Tensor:
        attend = _bound.attend = self.model.bind_attention(meta, kv_cache)
        # (bind, unbind) where the backend's library serves the operator itself for this step (the CPU
        # kernel's, decode-only): bound for the step only, so that no other step (nor another call) runs it
        native = getattr(attend, "native_step", None)
        graph = self._graph_for(input_ids)
        try:
            if native is not None:
                native[0]()
            with torch.inference_mode(), graph.weights():
                if graph.aot is None:
                    return self._traced(input_ids, positions)
                if graph.aot.guard_check(input_ids, positions):
                    return graph.aot(input_ids, positions)
                return self._eagerly(input_ids, positions)
        finally:
            _bound.attend = None
            if native is not None:
                native[1]()

    def _traced(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Without an artefact: through torch.compile's own path, traced at warm-up (inductor's caches serve
        a restart; AOT compiling bypasses them)."""
        # N is unbacked: no 0/1 specialisation, so N = 1 runs the same graph as every other N
        torch._dynamo.decorators.mark_unbacked(input_ids, 0)
        torch._dynamo.decorators.mark_unbacked(positions, 0)
        with torch.compiler.set_stance(self.stance_when_warm if self.warm else "default"):
            return self._graph_for(input_ids).compiled(input_ids, positions)

    def _eagerly(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A step the AOT graph does not serve (its guards said so): eager once warm, an error before
        (warm-up's steps must run the graph) or under "fail_on_recompile"."""
        if not self.warm or self.stance_when_warm == "fail_on_recompile":
            raise RuntimeError(f"the compiled step's guards reject a step of {input_ids.shape[0]} tokens")
        if not self._ran_eagerly:
            self._ran_eagerly = True
            log.warning("compile: a step's inputs do not match the compiled step's guards; such steps run "
                        "eagerly")
        return self._graph_for(input_ids).layers(input_ids, positions)

    @staticmethod
    def _compile_ahead(graph: _Graph, input_ids: torch.Tensor, positions: torch.Tensor):
        """Traces and compiles a graph ahead of time over example inputs, as a function that can be saved."""
        # N unbacked, as in _traced. Only the examples are marked: a loaded graph's guards reject marked
        # inputs, and neither a compiled nor a loaded graph needs them to serve every N.
        torch._dynamo.decorators.mark_unbacked(input_ids, 0)
        torch._dynamo.decorators.mark_unbacked(positions, 0)
        with torch.inference_mode(), graph.weights():
            aot = graph.compiled.aot_compile(((input_ids, positions), {}))
        aot.disable_guard_check()  # __call__ checks them first, to run eagerly where they fail
        return aot

    def warm_up(self, block_size: int, kv_dtype: torch.dtype | None = None) -> float:
        """Loads each graph from its artefact (saved by an earlier start) or compiles it (and saves it there;
        without an artefact, traces it at its first step), then runs a decode step and a prefill through it
        over a scratch cache (for the dense graph, of more tokens than the kernel's graph takes); returns the
        seconds it took. A saved graph that does not load or run is removed and compiled again."""
        started = time.perf_counter()
        for graph in self._graphs:
            self._warm_up_graph(graph, block_size, kv_dtype)
        self.warm = True
        self.warm_up_seconds = time.perf_counter() - started
        return self.warm_up_seconds

    def _warm_up_graph(self, graph: _Graph, block_size: int, kv_dtype: torch.dtype | None) -> None:
        device = self.model.device

        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        # n rows: a block each (each decode row attends to its block's first slot), the prefill over n tokens
        n = self.dense_above + 1 if graph.dense else 1
        kv = self.model.new_kv_cache(n, block_size, kv_dtype)
        rows = tensor(range(n))
        decode = AttentionMetadata(rows * block_size, n, rows[:, None], tensor([1] * n), max_decode_context=1)
        length = max(2, n)
        chunk = PrefillChunk(0, length, length, rows[: -(-length // block_size)])
        prefill = AttentionMetadata(tensor(range(length)), 0, rows[:0, None], tensor([]), [chunk])

        def run_warm_up_steps() -> None:
            self(tensor([0] * n), tensor([0] * n), decode, kv)
            self(tensor(range(length)), tensor(range(length)), prefill, kv)

        if graph.artefact is not None:
            # as the step runs: loading builds its guards against the dispatch state
            with torch.inference_mode():
                graph.aot = step_artefact.load(graph.artefact, self._external)
        if graph.aot is not None:
            graph.aot.disable_guard_check()
            try:
                run_warm_up_steps()
                graph.loaded = True
            except Exception as exc:  # noqa: BLE001 - loaded but unusable here: compile it again
                step_artefact.discard(graph.artefact, exc)
                graph.aot = None
        if graph.aot is None and graph.artefact is not None:
            graph.aot = self._compile_ahead(graph, tensor([0]), tensor([0]))
            run_warm_up_steps()
            step_artefact.save(graph.artefact, graph.aot, self._external)
        elif graph.aot is None:
            run_warm_up_steps()  # traces and compiles at the first


def cannot_compile(model) -> str | None:
    """Why this model's step cannot be compiled here, or None."""
    if not hasattr(model, "layers_forward"):
        return f"{type(model).__name__} has no layers_forward"
    if torch._dynamo.config.disable:
        return "torch.compile is disabled (TORCH_COMPILE_DISABLE=1)"
    from kvloop.engine.model.linear import int8_kernel_serves  # here: the rest of this file never needs it

    quantization = getattr(model, "quantization", "none")
    if quantization == "int4" or (quantization == "int8" and not int8_kernel_serves(model.device)):
        # model/linear.py picks their kernel by the step's row count (int8: without its own kernel built)
        return f"{quantization} weights choose their kernel by the step's size (not one graph for every size)"
    return compiler_missing() if model.device.type == "cpu" else None


def resolve_compile(mode: str, dtype_option: str, device: str) -> bool:
    """Whether the engine compiles its step. on/off as said; auto: on a CPU under --dtype auto (the engine's
    own choice of arithmetic, the serving path measured faster compiled), eager elsewhere: an explicit dtype
    is the exact reference path, and GPUs are not measured yet."""
    if mode != "auto":
        return mode == "on"
    return device == "cpu" and dtype_option == "auto"


def compile_or_none(model, block_size: int, kv_dtype: torch.dtype | None = None,
                    fingerprint: str = "") -> CompiledStep | None:
    """The model's compiled step, warm; None (the engine runs eagerly) where it cannot be compiled here,
    with a log line saying why. One per model: engines over the same model share it (the graph holds no
    engine state), so a second engine neither recompiles nor adds guards to check. With the checkpoint's
    fingerprint, the step is saved for (and loaded by) the next start (runner/step_artefact.py)."""
    if model in _compiled:
        return _compiled[model]
    os.environ[CACHE_ENV] = str(cache_dir())  # inductor reads it on every use
    reason = cannot_compile(model)
    if reason:
        log.warning("compile: %s; the step runs eagerly", reason)
        return None
    try:
        step = CompiledStep(model,
                            step_artefact.artefact_path(model, fingerprint, kv_dtype, INDUCTOR_OPTIONS))
        took = step.warm_up(block_size, kv_dtype)
    except Exception as exc:  # noqa: BLE001 - a failed compile costs speed, never the engine
        first = (str(exc).strip().splitlines() or [""])[0]
        log.warning("compile: compiling the step failed, it runs eagerly: %s: %s", type(exc).__name__, first)
        log.debug("compile: the failure in full", exc_info=True)
        return None
    if step.loaded:
        log.info("compile: the step loaded in %.1f s (%s)", took, step.artefact)
    else:
        log.info("compile: the step compiled in %.1f s (artefacts cached in %s)", took,
                 os.environ.get(CACHE_ENV))
    _compiled[model] = step
    return step


# model -> its warm CompiledStep, for the process's life (torch.compile's code cache holds the model anyway)
_compiled: dict[object, CompiledStep] = {}
