"""The engine loop: admit requests, schedule a step, run it, turn sampled tokens into outputs."""

from __future__ import annotations

import logging
import time
from collections import Counter

import torch

from kvloop.engine.config import EngineConfig
from kvloop.engine.core import host_memory
from kvloop.engine.core.batch import ScheduledBatch, StepResult
from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.sequence import Sequence
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.kernels.cpu import amx, linear_bf16w
from kvloop.engine.kv.manager import KVCacheManager
from kvloop.engine.kv.tier_mover import TierMover
from kvloop.engine.model.checkpoint import Checkpoint, load_checkpoint
from kvloop.engine.model.config import ModelConfig
from kvloop.engine.model.llama import LlamaModel
from kvloop.engine.model.locate import EMBEDDED_NAME, resolve_model_path
from kvloop.engine.model.registry import build_model
from kvloop.engine.output_processor import OutputState, RequestOutput
from kvloop.engine.runner.compiled_step import resolve_compile
from kvloop.engine.runner.logits_processors import MinTokens
from kvloop.engine.runner.model_runner import ModelRunner, resolve_kv_dtype
from kvloop.engine.runner.row_invariance import size_classes
from kvloop.engine.scheduler.bookkeeping import Sampled
from kvloop.engine.scheduler.scheduler import RequestRejected, Scheduler
from kvloop.engine.scheduler.slo_ledger import SloLedger
from kvloop.engine.scheduler.snapshot import build_snapshot
from kvloop.engine.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("kvloop.engine")
WARMUP_REQUEST_ID = "__warmup__"
PRICE_MIN_PREFILL_TOKENS = 64  # a step with fewer prefill tokens does not price recomputing (too noisy)
# With native bf16, quantization auto keeps the linear weights twice (packed for the kernel, dense for oneDNN)
# only while both copies take at most this share of the host's available memory at start-up.
DENSE_COPY_MEMORY_SHARE = 0.5


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        native = device.startswith("cuda") or cpu_capabilities().native_bf16
        return torch.bfloat16 if native else torch.float32
    return getattr(torch, name)


def resolve_quantization(name: str, dtype_name: str, device: str, linear_params: int = 0) -> str:
    """The weight format. auto, under dtype auto on a CPU with the bf16-weight kernel built: "bf16". Where
    dtype auto chose float32 (no native bf16) that is bf16 weights with float32 arithmetic: half the bytes a
    decode step streams. Where it chose bf16 (native bf16) and the kernel was built with bf16 pairs
    (AVX512-BF16), the kernel serves every step on a CPU without AMX. With AMX tiles (the kernel multiplies in
    them up to 64 rows, oneDNN's GEMM wins past that), or built without bf16 pairs, the kernel serves
    decode-sized steps and dense bf16 weights through oneDNN the larger ones (the compiled step's second
    graph): two bf16 copies of the `linear_params` linear weights, kept only while they take at most
    DENSE_COPY_MEMORY_SHARE of the host's available memory (a larger model keeps one copy, and oneDNN for
    every step). Dense weights in the model dtype elsewhere. Where each path wins, measured:
    docs/engine_history.md (weight formats)."""
    if name != "auto":
        return name
    if dtype_name == "auto" and device == "cpu" and linear_bf16w.available():
        native_bf16 = cpu_capabilities().native_bf16
        if native_bf16 and linear_bf16w.dense_above_rows() is None:
            log.info("bf16 weights through the bf16-weight kernel's bf16 pairs (AVX512-BF16) for every step "
                     "(--quantization none keeps oneDNN's bf16 GEMM)")
        elif native_bf16:
            both = 2 * 2 * linear_params  # packed + dense, bf16
            available = host_memory.available_bytes()
            if available is not None and both > DENSE_COPY_MEMORY_SHARE * available:
                log.info("dense bf16 weights through oneDNN for every step: the bf16-weight kernel's second "
                         "copy of the weights (%.1f GiB for both) would take over %.0f%% of the available "
                         "%.1f GiB",
                         both / 2**30, 100 * DENSE_COPY_MEMORY_SHARE, available / 2**30)
                return "none"
            log.info("bf16 weights: steps of up to %d rows through the bf16-weight kernel, larger ones "
                     "through oneDNN's bf16 GEMM%s (--quantization none keeps oneDNN for every step)",
                     linear_bf16w.dense_above_rows(), " (both in AMX tiles)" if linear_bf16w.tiles() else
                     " in AMX tiles" if amx.available() else "")
        else:
            log.info("weights in bf16, arithmetic in float32 (no native bf16 here; --quantization none keeps "
                     "dense float32 weights)")
        return "bf16"
    return "none"


def apply_pool_sizes(config: EngineConfig, kv_bytes_per_token: int) -> None:
    """Turns pool sizes given in memory units into token counts (whole blocks) for this model and dtype."""
    def tokens(nbytes: float) -> int:
        return int(nbytes // kv_bytes_per_token) // config.block_size * config.block_size

    if config.device_pool_mib is not None:
        config.kv_cache_tokens = max(config.block_size, tokens(config.device_pool_mib * 2**20))
    if config.host_pool_mib is not None:
        config.kv.host_cache_tokens = tokens(config.host_pool_mib * 2**20)
    if config.disk_pool_gib is not None:
        config.kv.disk_cache_tokens = tokens(config.disk_pool_gib * 2**30)


class EngineCore:
    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None,
                 model: LlamaModel | None = None, tokenizer: Tokenizer | None = None, fingerprint: str = "",
                 model_name: str = "random"):
        if config.threads:
            torch.set_num_threads(config.threads)
        if config.device == "auto":  # the operator's default: the GPU when there is one
            config.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.config = config
        self.dtype = resolve_dtype(config.dtype, config.device)
        started = time.perf_counter()  # the start-up's parts are logged at INFO: where a slow start goes
        if model is None:
            checkpoint = checkpoint or load_checkpoint(resolve_model_path(config.model),
                                                       progress=config.progress)
            log.info("start-up: checkpoint %s opened in %.1f s", checkpoint.path.name,
                     time.perf_counter() - started)
            # A GGUF's weights are dequantized and packed at every load: cache the result
            # (model/weight_cache.py)
            model = build_model(checkpoint.config, checkpoint.weights, self.dtype, config.device,
                                config.attention_backend,
                                resolve_quantization(config.quantization, config.dtype, config.device,
                                                     checkpoint.config.linear_params),
                                cache_fingerprint=checkpoint.fingerprint if checkpoint.path.suffix == ".gguf"
                                else None)
            tokenizer = tokenizer or Tokenizer.from_source(checkpoint.tokenizer_source)
            fingerprint = checkpoint.fingerprint
            log.info("start-up: model and tokenizer ready at %.1f s", time.perf_counter() - started)
            # the API serves the model under this name: the embedded default gets its plain, space-free name
            self.model_name = EMBEDDED_NAME if config.model in (None, "", "default") else checkpoint.name
        else:
            self.model_name = model_name
        self.model = model
        self.model_config: ModelConfig = model.cfg
        self.tokenizer = tokenizer
        # False: outputs carry token ids only, and requests come without stop strings (the server's engine
        # core process, whose API process detokenizes: engine/server/front_output.py)
        self.detokenize = True
        self.fingerprint = fingerprint
        self.kv_dtype = resolve_kv_dtype(config.kv_dtype, config.dtype, self.dtype)
        apply_pool_sizes(config,
                         model.cfg.kv_bytes_per_token(torch.tensor([], dtype=self.kv_dtype).element_size()))
        sched_cfg = config.scheduler
        sched_cfg.max_model_len = min(sched_cfg.max_model_len, model.cfg.max_position)
        # The dtypes are part of the block key too: a bf16 and an fp32 engine never share cached K/V.
        self.kv = KVCacheManager(config.num_blocks, config.block_size, config.kv,
                                 extra_key=f"{fingerprint}|{self.dtype}|kv={self.kv_dtype}")
        self.scheduler = Scheduler(sched_cfg, self.kv)
        self.runner = ModelRunner(model, config.num_blocks, config.block_size, self.kv_dtype, config.cascade,
                                  self.scheduler.step_cost.groups,
                                  compile=resolve_compile(config.compile, config.dtype, config.device),
                                  fingerprint=fingerprint)
        self.scheduler.set_attention_cost(self.runner.attention_cost)
        # proposals never carry a step into sizes that its linears round differently (exactness);
        # auto counts decode-sized steps' extra rows free up to the bf16-weight kernel's bound
        if self.scheduler.speculator.mode != "off":  # a probe of a second or so: only where it is needed
            self.scheduler.speculator.size_classes = size_classes(model)
        self.scheduler.speculator.model_layers = model.cfg.num_layers
        self.scheduler.speculator.free_tokens = (linear_bf16w.dense_above_rows()
                                                 or self.scheduler.speculator.free_tokens)
        log.info("start-up: KV pool and model runner ready at %.1f s", time.perf_counter() - started)
        # min_tokens holds EOS back: the tokenizer's ids (the grammar's mask, appended below, stays last)
        self.runner.sampler.processors.append(MinTokens(tokenizer.eos_token_ids if tokenizer else ()))
        if tokenizer is not None:  # response_format's grammar masks need the tokenizer's vocabulary
            from kvloop.engine.structured.compiler import compiler_for
            from kvloop.engine.structured.processor import GrammarMask

            self.runner.sampler.processors.append(GrammarMask(compiler_for(tokenizer, model.cfg.vocab_size)))
        if self.kv.host is not None or self.kv.disk is not None or self.kv.remote is not None:
            self.kv.attach_mover(TierMover.for_manager(self.kv, self.runner.kv_cache, fingerprint))
        self._states: dict[str, OutputState] = {}
        self._seqs: dict[str, Sequence] = {}
        self.eos_token_ids = tokenizer.eos_token_ids if tokenizer else set()
        self.num_steps = 0
        # stage -> requests failed alone (sampling, output...)
        self.request_failures: Counter[str] = Counter()
        self.step_failures = 0  # steps whose model forward raised (every request of the step failed)
        self.control = None  # the feedback loop's hook (engine.control), when a control file is configured
        if config.control_file:
            from kvloop.engine.control.hook import EngineControl

            self.control = EngineControl.attach(self, config.control_file, config.control_stale_after_s)
        log.info("start-up: engine built in %.1f s", time.perf_counter() - started)

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    user: str | None = None, arrival_time: float | None = None) -> Sequence:
        if request_id in self._seqs:
            raise ValueError(f"duplicate request id {request_id!r}")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise RequestRejected("bad_token", f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab})")
        seq = Sequence(request_id, list(prompt_token_ids), params, user=user)
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.scheduler.add(seq)
        detok = self.tokenizer.detokenizer() if self.tokenizer and self.detokenize else _NullDetokenizer()
        self._states[request_id] = OutputState(seq, detok)
        self._seqs[request_id] = seq
        return seq

    def abort(self, request_id: str, reason: str = "abort") -> bool:
        """Ends the request now. A `reason` other than "abort": it ended outside the core and is judged
        against the SLO as such (a stop string the API process matched: "stop"; its output processing
        failed: "error")."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, reason)
        self._states.pop(request_id, None)
        self.runner.sampler.forget(request_id)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def drain(self, max_steps: int | None = None) -> dict[str, RequestOutput]:
        """Steps until every request has finished; returns request id -> final output."""
        final: dict[str, RequestOutput] = {}
        steps = 0
        while self.has_unfinished():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"requests still unfinished after {max_steps} steps")
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
            steps += 1
        return final

    def warm_up(self) -> None:
        """One tiny request run out of the books, so the first client does not pay for lazy initialisation.
        The control block never sees it: its footprint (a 4-token prompt) would place the coordinator's first
        cap, and its TTFT (lazy set-up included) would read as a P99 breach. Nor do the finish counters."""
        control, self.control = self.control, None
        finished, generated = self.scheduler.requests_finished, self.scheduler.tokens_generated
        ledger = self.scheduler.slo_ledger  # nor the SLO counts: a first compile would read as a TTFT miss
        self.scheduler.slo_ledger = SloLedger(ledger.slo)
        try:
            self.add_request(WARMUP_REQUEST_ID, [0, 1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))
            self.drain(max_steps=100)
        finally:
            self.control = control
            self.scheduler.requests_finished, self.scheduler.tokens_generated = finished, generated
            self.scheduler.slo_ledger = ledger

    def snapshot(self) -> EngineSnapshot:
        """Engine state for metrics, the control block and the benchmark harness."""
        return build_snapshot(self.scheduler, self.kv, num_steps=self.num_steps,
                              step_failures=self.step_failures,
                              request_failures=self.request_failures)

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        began = time.perf_counter()  # the whole step is the gap between a decode row's tokens
        batch = self.scheduler.schedule()
        failed = self._failed_outputs()
        if not batch:
            if self.control is not None:  # idle steps still publish, so the sidecar sees a live engine
                self.control.after_step(self, failed)
            return failed
        started = time.perf_counter()
        try:
            result = self.runner.execute(batch)
        except Exception as exc:  # noqa: BLE001 - not one request's fault: fail this step's requests, go on
            log.exception("the model step failed; failing its %d requests", len(batch.items))
            self.step_failures += 1
            message = f"the model step failed: {type(exc).__name__}: {exc}"
            # num_computed_tokens is not advanced, so releasing the blocks indexes none of this step's K/V
            outputs = failed + [self._fail_request(item.seq, "step", message) for item in batch.items]
        else:
            self.num_steps += 1
            self._observe_prefill(batch, time.perf_counter() - started)
            outputs = failed + self._process(batch, result)
            self.scheduler.observe_step(time.perf_counter() - began, bool(batch.decodes))
        if self.control is not None:
            self.control.after_step(self, outputs)
        return outputs

    def _observe_prefill(self, batch: ScheduledBatch, seconds: float) -> None:
        """Prefill-dominated steps price recomputing a token, which the KV manager weighs against loading a
        lower-tier block (kv/load_or_recompute.py). Decode-heavy steps are left out: their time per token is
        weight streaming, not what a recomputed prefix would cost."""
        prefill = sum(item.num_tokens for item in batch.prefills)
        if prefill >= PRICE_MIN_PREFILL_TOKENS and prefill >= 4 * len(batch.decodes):
            self.kv.tier_costs.observe_compute(batch.num_tokens, seconds)

    def _failed_outputs(self) -> list[RequestOutput]:
        """Requests the scheduler failed this step (static mode's out-of-memory): finish_reason 'error'."""
        outputs = []
        for seq in self.scheduler.take_failed():
            self._seqs.pop(seq.request_id, None)
            state = self._states.pop(seq.request_id, None)
            self.runner.sampler.forget(seq.request_id)
            if state is not None:
                out = state.output(True, "error")
                out.error = seq.error
                outputs.append(out)
        return outputs

    def _fail_request(self, seq: Sequence, stage: str, message: str) -> RequestOutput:
        """Ends one request with finish_reason "error" (its blocks freed) and reports it; the rest go on."""
        self.request_failures[stage] += 1
        self.scheduler.finish(seq, "error")  # a no-op when it had finished just before failing
        self._seqs.pop(seq.request_id, None)
        state = self._states.pop(seq.request_id, None) or OutputState(seq, _NullDetokenizer())
        self.runner.sampler.forget(seq.request_id)
        try:
            out = state.output(True, "error")
        except Exception:  # noqa: BLE001 - the output state may be what failed: report without its text
            out = RequestOutput(seq.request_id, "", "", [], [], True, "error", seq.num_prompt_tokens,
                                seq.num_cached_tokens, arrival_time=seq.arrival_time)
        out.finish_reason, out.error, out.error_stage = "error", message, stage
        return out

    def _process(self, batch: ScheduledBatch, result: StepResult) -> list[RequestOutput]:
        """The scheduler's bookkeeping (tokens, times, the stop-token and length finishes), then each
        sampled request's output: a failure of its own ends it alone."""
        outputs = []
        for sampled in self.scheduler.update_from_output(batch, result, eos_token_ids=self.eos_token_ids):
            seq = sampled.seq
            if sampled.error is not None:  # the scheduler has finished it ("error"): report it
                stage, message = sampled.error
                log.warning("request %s failed in %s: %s", seq.request_id, stage, message)
                outputs.append(self._fail_request(seq, stage, f"{stage} failed: {message}"))
                continue
            try:
                outputs.append(self._on_token(sampled))
            except Exception as exc:  # noqa: BLE001 - stop handling or detokenization of this request
                log.exception("request %s failed in output processing", seq.request_id)
                outputs.append(self._fail_request(seq, "output", f"output processing failed: "
                                                                  f"{type(exc).__name__}: {exc}"))
        return outputs

    def _on_token(self, sampled: Sampled) -> RequestOutput:
        seq = sampled.seq
        state = self._states[seq.request_id]
        tokens = sampled.tokens or [sampled.token]
        reason = None
        for i, token in enumerate(tokens):  # a speculating row's several tokens: judged one at a time
            last = i == len(tokens) - 1
            reason = state.on_token(token, sampled.finish_reason if last else None)
            if reason is not None and not last:
                discard_after(seq, len(tokens) - 1 - i)  # a stop string mid-step: what follows never was
                break
        if reason != sampled.finish_reason:
            # A stop string ends the request here. When its token also reached max_tokens, the scheduler has
            # finished it already ("length"): "stop" wins, as it always has.
            self.scheduler.finish(seq, reason)
            seq.finish_reason = reason
        if reason is not None:
            self._seqs.pop(seq.request_id, None)
            self._states.pop(seq.request_id, None)
            self.runner.sampler.forget(seq.request_id)
        return state.output(reason is not None, reason)


def discard_after(seq: Sequence, n: int) -> None:
    """Drops seq's last n tokens (and their logprobs), appended in a step that a stop string ended before
    them; computed tokens never count past the tokens kept."""
    if n <= 0:
        return
    del seq.token_ids[-n:]
    keep = seq.num_output_tokens
    del seq.logprobs[keep:]
    seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens)


class _NullDetokenizer:
    text = ""

    def add(self, token_id: int) -> str:
        return ""

    def flush(self) -> str:
        return ""
