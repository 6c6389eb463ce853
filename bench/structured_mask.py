"""Structured-output libraries compared on this CPU: grammar compile time for a few JSON schemas and the
per-step cost of filling the token masks of a batch of rows and applying them to a [B, vocab] fp32 logits
tensor, with the embedded model's tokenizer. Every installed library among xgrammar, llguidance and
outlines-core is measured; a missing one is recorded as such. Writes bench/results/structured_mask.json
and .md (top-level `goals`: the pick rule, computed from the measurements).

Each row follows its own valid JSON document token by token (the documents are tokenized with the
engine's tokenizer), so every step measures masks of rows in different grammar states, as in a batch.

    .venv/bin/python bench/structured_mask.py                      # batch 32, all schemas
    .venv/bin/python bench/structured_mask.py --batch 4 --steps 5  # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.machine import machine_info

HERE = Path(__file__).resolve().parent
MAX_COMPILE_MS = 1000.0
sys.path.insert(0, str(HERE))
from api import other_cpu  # noqa: E402  (the same quietness sample as the API benchmark)

# name -> (schema, documents that satisfy it; rows cycle through them)
SCHEMAS: dict[str, tuple[dict, list]] = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             [{"name": "Ada Lovelace", "age": 36}, {"name": "Alan", "age": 41},
              {"name": "Grace Hopper", "age": 85}]),
    "nested": ({"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "status": {"enum": ["open", "closed", "pending"]},
        "owner": {"type": "object", "properties": {"email": {"type": "string"}, "score": {"type": "number"}},
                  "required": ["email", "score"], "additionalProperties": False}},
        "required": ["id", "tags", "status", "owner"], "additionalProperties": False},
        [{"id": 7, "tags": ["a", "bb"], "status": "open", "owner": {"email": "x@y.z", "score": 1.5}},
         {"id": 12345, "tags": [], "status": "pending",
          "owner": {"email": "someone@example.com", "score": -3}}]),
    "any_json": ({"type": "object"},  # what json_object asks for: any JSON object
                 [{"a": [1, 2, {"b": None}], "c": "text"}, {"key": True, "n": 3.25}]),
}


def gpt2_byte_decoder() -> dict[str, int]:
    """Byte-level BPE writes every byte as one printable character; this maps the characters back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


# ---- one adapter per library: compile(schema) -> grammar; matchers(grammar, n); fill(matchers, bitmask);
# accept(matchers, tokens) -------------------------------------------------------------------------------
class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, threads: int):
        import xgrammar as xgr

        self.xgr = xgr
        vocab = [t for t, _ in sorted(tok.backend.get_vocab(with_added_tokens=True).items(),
                                      key=lambda kv: kv[1])]
        info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size,
                                 stop_token_ids=sorted(tok.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads) if threads > 1 else None

    def compile(self, schema: dict):
        # strict_mode=False: plain JSON Schema semantics (extra properties allowed unless the schema says no).
        # Flexible whitespace: compact-only whitespace rejects [1,2] inside free-form values in 0.2.8.
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)

    def matchers(self, grammar, n: int) -> list:
        return [self.xgr.GrammarMatcher(grammar) for _ in range(n)]

    def fill(self, matchers: list, bitmask) -> None:
        if self.batch is not None:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)
            return
        for row, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, row)

    def apply(self, logits, bitmask) -> None:
        """xgrammar ships a C++ CPU kernel for this; the other libraries use the engine's torch one."""
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, backend="cpu")

    def accept(self, matchers: list, tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            if not m.accept_token(t):
                raise RuntimeError(f"xgrammar rejected token {t}")


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, threads: int):
        import llguidance

        self.ll = llguidance
        self.tok = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                                          eos_token=sorted(tok.eos_token_ids))
        self.executor = llguidance.LLExecutor(threads) if threads > 1 else None

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                             defaults={"whitespace_flexible": False})
        is_error, messages = self.ll.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if is_error:
            raise ValueError(messages[0])
        self.ll.LLMatcher(self.tok, grammar)  # the first matcher builds the parser: part of compiling
        return grammar

    def matchers(self, grammar, n: int) -> list:
        return [self.ll.LLMatcher(self.tok, grammar) for _ in range(n)]

    def fill(self, matchers: list, bitmask) -> None:
        if self.executor is not None:
            self.executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)],
                                                  bitmask.data_ptr(),
                                                  bitmask.shape[1] * 4, bitmask.shape[0])
            return
        for row, m in enumerate(matchers):
            v = bitmask[row]
            m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * 4)

    def accept(self, matchers: list, tokens: list[int]) -> None:
        for m, t in zip(matchers, tokens, strict=True):
            if not m.consume_token(t):
                raise RuntimeError(f"llguidance rejected token {t}: {m.get_error()}")


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, threads: int):
        import outlines_core

        self.oc = outlines_core
        decode = gpt2_byte_decoder()
        special = {t.content for t in tok.backend.get_added_tokens_decoder().values()}
        eos = min(tok.eos_token_ids)
        table: dict[bytes, list[int]] = {}
        for text, i in tok.backend.get_vocab(with_added_tokens=True).items():
            if text in special or i in tok.eos_token_ids:
                continue
            table.setdefault(bytes(decode[c] for c in text), []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, table)

    def compile(self, schema: dict):
        from outlines_core.json_schema import build_regex_from_schema

        return self.oc.Index(build_regex_from_schema(json.dumps(schema)), self.vocab)

    def matchers(self, grammar, n: int) -> list:
        return [self.oc.Guide(grammar) for _ in range(n)]

    def fill(self, matchers: list, bitmask) -> None:
        for row, g in enumerate(matchers):
            v = bitmask[row]
            g.write_mask_into(v.data_ptr(), v.numel(), 4)

    def accept(self, matchers: list, tokens: list[int]) -> None:
        for g, t in zip(matchers, tokens, strict=True):
            g.advance(t, return_tokens=False)


LIBRARIES: dict[str, Callable] = {"xgrammar": XGrammar, "llguidance": LLGuidance,
                                  "outlines-core": OutlinesCore}


def measure(lib, tok, batch: int, steps: int, compile_repeats: int) -> dict:
    import torch

    from kvloop.engine.structured.bitmask import apply_bitmask, bitmask_words

    out: dict = {"schemas": {}}
    for name, (schema, docs) in SCHEMAS.items():
        times = []
        for _ in range(compile_repeats):
            t0 = time.perf_counter()
            grammar = lib.compile(schema)
            times.append(time.perf_counter() - t0)
        rows = [tok.encode(json.dumps(docs[r % len(docs)], separators=(",", ":"))) for r in range(batch)]
        n_steps = min(steps, min(len(r) for r in rows))
        matchers = lib.matchers(grammar, batch)
        bitmask = torch.zeros(batch, bitmask_words(tok.vocab_size), dtype=torch.int32)
        fresh = torch.randn(batch, tok.vocab_size)
        logits = torch.empty_like(fresh)
        apply = getattr(lib, "apply", apply_bitmask)
        fill_s, apply_s = [], []
        for step in range(n_steps):
            logits.copy_(fresh)  # masking is in place: every step starts from unmasked logits
            t0 = time.perf_counter()
            lib.fill(matchers, bitmask)
            t1 = time.perf_counter()
            apply(logits, bitmask)
            t2 = time.perf_counter()
            fill_s.append(t1 - t0)
            apply_s.append(t2 - t1)
            allowed = logits[range(batch), [r[step] for r in rows]]
            if not torch.isfinite(allowed).all():
                raise RuntimeError(f"{lib.name} masked out the document's own token at step {step} ({name})")
            lib.accept(matchers, [r[step] for r in rows])
        total = [f + a for f, a in zip(fill_s, apply_s, strict=True)]
        out["schemas"][name] = {
            "compile_ms": round(statistics.median(times) * 1e3, 2),
            "compile_ms_runs": [round(t * 1e3, 2) for t in times],
            "steps": n_steps, "fill_ms": round(statistics.median(fill_s) * 1e3, 3),
            "apply_ms": round(statistics.median(apply_s) * 1e3, 3),
            "step_ms": round(statistics.median(total) * 1e3, 3),
            "step_ms_max": round(max(total) * 1e3, 3)}
    out["step_ms_median_over_schemas"] = round(statistics.median(s["step_ms"]
                                                                 for s in out["schemas"].values()), 3)
    return out


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    w = result["workload"]
    lines = ["# Structured outputs: grammar mask cost per step", "",
             f"Batch {w['batch']}, vocab {w['vocab']} (the embedded model's tokenizer), up to {w['steps']} "
             f"steps per schema, {w['threads']} mask thread(s), {result['machine']['cpus']} CPUs "
             f"({result['machine']['cpu']}). "
             "A step = fill every row's token bitmask + apply the masks to a [batch, vocab] fp32 logits "
             "tensor; medians over steps. Apply: xgrammar's own CPU kernel for xgrammar, the engine's torch "
             "version (engine/structured/bitmask.py) for the others.", "",
             "| library | version | schema | compile (ms) | fill (ms) | apply (ms) | step (ms) | step max "
             "(ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for lib, r in result["libraries"].items():
        if "error" in r:
            lines.append(f"| {lib} | {r.get('version', '-')} | - | not measured: {r['error']} | | | | |")
            continue
        for s, v in r["schemas"].items():
            lines.append(f"| {lib} | {r['version']} | {s} | {v['compile_ms']} | {v['fill_ms']} | "
                         f"{v['apply_ms']} | {v['step_ms']} | {v['step_ms_max']} |")
    q = result["quietness"]
    lines += ["",
              f"Fastest per step (median over schemas): **{result['fastest']}**. Pick "
              f"({result['pick_rule']}): **{result['pick']}**.", "",
              f"CPU: {result['machine']['model']}; flags: {' '.join(result['machine']['flags'])}.", "",
              f"Machine quietness (other processes' CPU as a share of the machine): before {q['before']}, "
              f"after {q['after']}."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def pick_goals(result: dict) -> list[dict]:
    """The pick rule as goals: the library the engine uses compiles every schema within the request-path
    bound, and its step cost stays within 25% of the fastest library's (the price of that bound, stated)."""
    pick, fastest = result["pick"], result["fastest"]
    if pick is None:
        return [goal("a library compiles every schema within the bound", None, "<=", MAX_COMPILE_MS)]
    libs = result["libraries"]
    slowest_compile = max(s["compile_ms"] for s in libs[pick]["schemas"].values())
    ratio = libs[pick]["step_ms_median_over_schemas"] / libs[fastest]["step_ms_median_over_schemas"]
    return [goal(f"{pick}: slowest schema compile, ms", slowest_compile, "<=", MAX_COMPILE_MS),
            goal(f"{pick} step cost / fastest library's ({fastest})", round(ratio, 3), "<=", 1.25)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=64, help="at most this many steps per schema")
    p.add_argument("--compile-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="mask threads (1: rows filled one after another)")
    p.add_argument("--libraries", default=",".join(LIBRARIES))
    p.add_argument("--out", type=Path, default=HERE / "results" / "structured_mask.json")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import embedded_model_path
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    torch.set_num_threads(1)
    tok = Tokenizer.from_source(load_checkpoint(embedded_model_path(), progress=False).tokenizer_source)
    before = other_cpu()
    results: dict = {}
    for name in args.libraries.split(","):
        try:
            ver = version(name)
        except PackageNotFoundError:
            results[name] = {"error": "not installed"}
            continue
        try:
            results[name] = {"version": ver,
                             **measure(LIBRARIES[name](tok, args.threads), tok, args.batch, args.steps,
                                                      args.compile_repeats)}
        except Exception as e:  # a library that cannot handle a schema is a result, not a crash
            results[name] = {"version": ver, "error": f"{type(e).__name__}: {e}"}
        print(name, json.dumps(results[name]), flush=True)
    after = other_cpu()
    measured = {k: v["step_ms_median_over_schemas"] for k, v in results.items() if "error" not in v}
    # A json_object request compiles on the request path (once per schema, then cached): a library whose
    # compile takes seconds for some schema is out, whatever its step cost.
    usable = {k: ms for k, ms in measured.items()
              if max(s["compile_ms"] for s in results[k]["schemas"].values()) <= MAX_COMPILE_MS}
    result = {"fastest": min(measured, key=measured.get) if measured else None,
              "pick": min(usable, key=usable.get) if usable else None,
              "pick_rule": "lowest median step cost among libraries compiling every schema in <= "
              f"{MAX_COMPILE_MS} ms",
              "libraries": results,
              "workload": {"batch": args.batch, "steps": args.steps, "vocab": tok.vocab_size,
                           "threads": args.threads, "compile_repeats": args.compile_repeats,
                           "schemas": {k: s for k, (s, _) in SCHEMAS.items()}},
              "quietness": {"before": before, "after": after},
              "machine": machine_info()}
    result["goals"] = pick_goals(result)
    write(result, args.out)
    print(json.dumps({k: result[k] for k in ("fastest", "pick", "goals")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
