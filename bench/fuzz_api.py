"""Fuzzes the values the engine consumes, over the whole request schema of /v1/completions and
/v1/chat/completions, against a live server: boundary and extreme numbers (huge and negative integers,
NaN and infinities as JSON tokens, subnormals), empty, huge and odd unicode strings, wrong types, nested
lists, unknown fields. tests/server/test_schemathesis.py checks the schema's shapes; this checks what
the values do inside the engine.

A case passes when the server answers below 500 and, for a stream, no server-side error event follows;
the engine must never stop (/health 200) and, after the run, a greedy request must get the answer it got
before. tests/server/test_fuzz_api.py runs it in CI on a bounded budget; this script runs it for minutes
against a real `kvloop serve` and writes the figures (cases tried, 5xx seen, engine stops seen):

    .venv/bin/python bench/fuzz_api.py --minutes 5            # or: make fuzz
    .venv/bin/python bench/fuzz_api.py --minutes 0.2 --out /tmp/fuzz.json   # smoke run
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvloop.engine.bench.goals import goal
from kvloop.engine.bench.ready import wait_ready

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
VOCAB_HINT = 49152  # SmolLM2's; ids around it are the interesting boundary
MAX_TOKENS_RUN = 3  # an accepted request generates at most this many tokens per choice (cheap in CI)
REFERENCE = {"model": "default", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}

# ---- values ---------------------------------------------------------------------------------------------
BIG_INTS = [0, 1, -1, 2, 3, 16, 17, 20, 21, 255, 256, VOCAB_HINT - 1, VOCAB_HINT, 2**31 - 1, 2**31, 2**32,
            2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**30)]
FLOATS = [0.0, -0.0, 1e-300, 5e-324, 1.4e-45, 1e-40, 1e-8, 0.0099, 0.01, 0.5, 1.0, 1.0000001, 2.0, 2.0000001,
          100.0, 100.5, -100.5, 1e38, 3.5e38, 1e308, -1e308, math.inf, -math.inf, math.nan]
STRINGS = ["", " ", "a", "0", "-1", "1e3", "NaN", "\x00", "\u00e9\u4e2d\U0001f600", "\ud800", "\u202e",
           "\n" * 3,
           "x" * 257, "y" * 5000, "<|im_end|>", "<|im_start|>system", "{{ raise_exception('x') }}"]
ODD = [None, True, False, [], {}, [[[]]], [[[[[[[[1]]]]]]]], {"a": {"b": {"c": []}}}]


def weird() -> st.SearchStrategy:
    """Any value of the wrong shape or an extreme one: what a hostile client sends in any field."""
    return st.one_of(st.sampled_from(BIG_INTS), st.sampled_from(FLOATS), st.sampled_from(STRINGS),
                     st.sampled_from(ODD), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=40), st.lists(st.integers(-3, VOCAB_HINT + 3), max_size=4))


# Valid values, biased to their boundaries: requests that pass validation and reach the engine's
# arithmetic with extreme numbers are where an engine killer hides.
TEXT = st.sampled_from(["hi", "The capital of France is", "\u00e9\u4e2d\U0001f600", "<|im_end|>", "{{ x }}",
                        "\u202e", "a b c", " ", "1, 2, 3,"])
TOKEN = st.one_of(st.integers(0, 300), st.sampled_from([0, VOCAB_HINT - 1]))
VALID: dict[str, st.SearchStrategy] = {
    "max_tokens": st.integers(1, MAX_TOKENS_RUN),
    "temperature": st.one_of(st.sampled_from([0, 0.0, 0.01, 0.0100001, 1, 2, 2.0]), st.floats(0.01, 2)),
    "top_p": st.one_of(st.sampled_from([5e-324, 1e-300, 1.4e-45, 1e-8, 1, 1.0]),
                       st.floats(0, 1, exclude_min=True)),
    "top_k": st.one_of(st.sampled_from([-1, 0, 1, 2, VOCAB_HINT - 1, VOCAB_HINT, VOCAB_HINT + 1, 2**31 - 1]),
                       st.integers(-1, 100)),
    "n": st.integers(1, 2),
    "seed": st.one_of(st.sampled_from([-(2**63), -1, 0, 2**63 - 2, 2**63 - 1]),
                      st.integers(-(2**63), 2**63 - 1)),
    "stop": st.one_of(TEXT.filter(bool),
                      st.lists(st.one_of(TEXT.filter(bool), st.just("z" * 256)), max_size=16)),
    "presence_penalty": st.one_of(st.sampled_from([-2, 2, 0, -2.0, 2.0]), st.floats(-2, 2)),
    "frequency_penalty": st.one_of(st.sampled_from([-2, 2, 0, -2.0, 2.0]), st.floats(-2, 2)),
    "logit_bias": st.dictionaries(TOKEN.map(str), st.one_of(st.sampled_from([-100, 100, 0, -100.0, 100.0]),
                                                            st.floats(-100, 100)), max_size=5),
    "stop_token_ids": st.lists(st.one_of(TOKEN, st.just(2**31 - 1)), max_size=3),
    "ignore_eos": st.booleans(), "include_stop_str_in_output": st.booleans(), "stream": st.booleans(),
    "user": st.text(max_size=20), "safety_identifier": st.text(max_size=20),
    "prompt_cache_key": st.text(max_size=20),
    "service_tier": st.sampled_from(["auto", "default"]), "store": st.just(False),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": {"type": "object"}}}]),
}
CHAT_VALID = {
    "max_completion_tokens": st.integers(1, MAX_TOKENS_RUN), "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20), "tool_choice": st.just("none"), "modalities": st.just(["text"]),
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
         "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                                             min_size=1, max_size=3))},
        optional={"name": st.text(max_size=8)}), min_size=1, max_size=3),
}
COMPLETION_VALID = {
    "logprobs": st.integers(0, 20), "echo": st.just(False), "best_of": st.integers(1, 2),
    "prompt": st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3), st.lists(TOKEN, min_size=1, max_size=6),
                        st.lists(st.lists(TOKEN, min_size=1, max_size=4), min_size=1, max_size=2)),
}
# Any field of either endpoint (and some that neither has) may get a hostile value instead.
HOSTILE_FIELDS = sorted({*VALID, *CHAT_VALID, *COMPLETION_VALID, "model", "stream_options", "tools",
                         "parallel_tool_calls", "audio", "prediction", "reasoning_effort", "functions",
                         "function_call", "metadata", "suffix", "web_search_options", "min_tokens", "bogus",
                         ""})


def hostile_message() -> st.SearchStrategy:
    part = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "file", "",
                                                                     "text"]),
                                            "image_url": st.just({"url": "http://x/y.png"})}), weird())
    return st.fixed_dictionaries(
        {"role": st.one_of(st.sampled_from(["user", "assistant", "tool"]), weird()),
         "content": st.one_of(st.lists(part, max_size=3), weird())},
        optional={"tool_calls": weird(), "refusal": weird(), "bogus": weird(), "name": weird()})


def body(required: dict[str, st.SearchStrategy], valid: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A valid request with some optional fields, then up to two fields given hostile values."""
    plausible = st.fixed_dictionaries({"model": st.just("default"), **required}, optional=valid)
    hostile = st.lists(st.tuples(st.sampled_from(HOSTILE_FIELDS), weird()), max_size=2)
    nested = st.lists(hostile_message(), max_size=1)

    def mutate(parts) -> dict:
        request, changes, messages = parts
        for name, value in changes:
            request[name] = value
        if messages and isinstance(request.get("messages"), list):
            request["messages"] = request["messages"] + messages
        return request

    return st.tuples(plausible, hostile, nested).map(mutate)


def cases() -> st.SearchStrategy:
    """(path, body): mostly objects; now and then a body of another JSON type."""
    chat_valid = {k: v for k, v in {**VALID, **CHAT_VALID}.items() if k != "messages"}
    comp_valid = {k: v for k, v in {**VALID, **COMPLETION_VALID}.items() if k != "prompt"}
    return st.one_of(st.tuples(st.just(CHAT), body({"messages": CHAT_VALID["messages"]}, chat_valid)),
                     st.tuples(st.just(COMP), body({"prompt": COMPLETION_VALID["prompt"]}, comp_valid)),
                     st.tuples(st.sampled_from([CHAT, COMP]), weird()))


def keep_cheap(body) -> None:
    """An accepted request generates at most MAX_TOKENS_RUN tokens per choice and at most 2 choices: the
    fuzz is about values, not load. Out-of-range values are kept: they must still get their 400."""
    if not isinstance(body, dict):
        return
    keys = [k for k in ("max_tokens", "max_completion_tokens") if k in body]
    for k in keys:
        v = body[k]
        if type(v) is int and MAX_TOKENS_RUN < v <= 1 << 20:  # past the context, it is a cheap 400 anyway
            body[k] = MAX_TOKENS_RUN
    if not any(type(body.get(k)) is int and 0 < body[k] <= MAX_TOKENS_RUN for k in keys):
        body["max_tokens" if "max_completion_tokens" not in body
             else "max_completion_tokens"] = MAX_TOKENS_RUN
    for k in ("n", "best_of"):
        if type(body.get(k)) is int and 2 < body[k] <= 64:
            body[k] = 2


# ---- sending and judging ----------------------------------------------------------------------------------
@dataclass
class Tally:
    cases: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    server_errors: list[dict] = field(default_factory=list)  # 5xx, or a server error event inside a stream
    engine_stops: int = 0

    def summary(self) -> dict:
        return {"cases": self.cases, "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "server_errors": len(self.server_errors), "engine_stops": self.engine_stops,
                "server_error_examples": self.server_errors[:10]}


def send(client: httpx.Client, path: str, body) -> tuple[int, str | None]:
    """The status and, for a failed case, why: a 5xx, or a stream that carried a server-side error."""
    data = json.dumps(body, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    with client.stream("POST", path, content=data, headers={"content-type": "application/json"}) as resp:
        text = resp.read().decode("utf-8", "replace")
    if resp.status_code >= 500:
        return resp.status_code, text[:300]
    if resp.status_code == 200 and text.startswith("data:"):
        for line in text.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                err = json.loads(line[6:]).get("error") or {}
                if err.get("type") == "server_error" or str(err.get("code")) in ("request_failed",
                                                                                 "internal_error"):
                    return 200, line[:300]
    return resp.status_code, None


def run_case(client: httpx.Client, tally: Tally, path: str, body) -> str | None:
    keep_cheap(body)
    status, failure = send(client, path, body)
    tally.cases += 1
    tally.statuses[status] += 1
    if failure is not None:
        tally.server_errors.append({"path": path, "status": status, "body": _short(body), "answer": failure})
    return failure


def _short(value):
    if isinstance(value, str):
        return value[:80]
    if isinstance(value, list):
        return [_short(v) for v in value[:5]]
    if isinstance(value, dict):
        return {str(k)[:40]: _short(v) for k, v in list(value.items())[:40]}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def fuzz(client: httpx.Client, tally: Tally, examples: int, seed: int | None = 0,
         strict: bool = True) -> None:
    """Runs `examples` generated cases. strict: the first failing case fails (a test); else they are
    counted and the run goes on (the long run)."""
    @given(case=cases())
    @settings(max_examples=examples, deadline=None, derandomize=seed is not None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def one(case):
        path, body = case
        failure = run_case(client, tally, path, body)
        if strict:
            assert failure is None, (path, body, failure)

    one()


def greedy(client: httpx.Client) -> str:
    resp = client.post(COMP, json=REFERENCE)
    resp.raise_for_status()
    return resp.json()["choices"][0]["text"]


# ---- the long run -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    kvloop = Path(sys.executable).with_name("kvloop")
    cmd = [str(kvloop), "serve", "--port", str(port), "--threads", "1", "--kv-cache-tokens", "8192",
           "--max-pending", "64", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_ready(proc, f"http://127.0.0.1:{port}/ready")
    return proc


def engine_alive(client: httpx.Client, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        return False
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def fuzz_goals(result: dict) -> list[dict]:
    """Issue 20's fuzz goals, from the run's own tallies."""
    return [goal("5xx answers and server errors inside streams", result["server_errors"], "<=", 0),
            goal("engine stops", result["engine_stops"], "<=", 0),
            goal("greedy answer unchanged after fuzzing (1 = yes)", int(result["greedy_unchanged"]), ">=", 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=100, help="cases per hypothesis run (a new seed each)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "fuzz_api.json"))
    args = p.parse_args(argv)
    port = _free_port()
    proc = start_server(port)
    tally = Tally()
    started = time.monotonic()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            before = greedy(client)
            batch = 0
            while time.monotonic() - started < args.minutes * 60:
                fuzz(client, tally, args.batch, seed=None, strict=False)
                batch += 1
                if not engine_alive(client, proc):
                    tally.engine_stops += 1
                    proc.kill()
                    proc.wait()
                    proc = start_server(port)
                print(f"{time.monotonic() - started:6.0f} s  cases {tally.cases}  5xx/stream errors "
                      f"{len(tally.server_errors)}  engine stops {tally.engine_stops}", flush=True)
            after = greedy(client)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    result = {**tally.summary(), "greedy_unchanged": before == after,
              "duration_s": round(time.monotonic() - started, 1),
              "cases_per_s": round(tally.cases / max(1e-9, time.monotonic() - started), 1),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    result["goals"] = fuzz_goals(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "server_error_examples"}, indent=2))
    ok = not tally.server_errors and not tally.engine_stops and before == after
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
