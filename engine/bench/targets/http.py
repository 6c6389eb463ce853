"""HTTP targets: any OpenAI-compatible server (/v1/completions, streamed) and llama.cpp's native /completion.

One thread per request streams the response and queues events; poll() drains the queue. Prompts go as
token-id lists, with temperature 0, ignore_eos and a fixed max_tokens, so every system generates the
same number of tokens."""

from __future__ import annotations

import json
import queue
import re
import threading
import time

import httpx

from kvloop.engine.bench.targets.base import Event, Target
from kvloop.engine.core.kv_stats import TIERS, KVStats
from kvloop.engine.core.snapshot import EngineSnapshot

_METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaINF]+)$')
_LABEL = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"')


def parse_prometheus(text: str) -> dict[str, float]:
    """name or name{labels} -> value (labels kept verbatim, minus model_name)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        pairs = [p for p in _LABEL.findall(m.group(2) or "") if not p.startswith("model_name=")]
        try:
            out[m.group(1) + ("{" + ",".join(pairs) + "}" if pairs else "")] = float(m.group(3))
        except ValueError:
            pass
    return out


def kvloop_snapshot(metrics: dict[str, float]) -> EngineSnapshot | None:
    """The engine snapshot as far as a kvloop server's /metrics tells it (what the benchmark reads); None
    for servers that are not kvloop (their families differ, and a made-up zero is worse than none)."""
    if "kvloop:num_requests_waiting" not in metrics:
        return None

    def get(name: str, labels: str = "") -> float:
        for n in (f"{name}_total{labels}", f"{name}{labels}"):  # counters carry _total
            if n in metrics:
                return metrics[n]
        return 0.0

    def count(name: str, labels: str = "") -> int:
        return int(get(name, labels))

    tier = {t: f'{{tier="{t}"}}' for t in TIERS}
    stats = KVStats(**{f"query_tokens_{t}": count("kvloop:prefix_cache_tier_queries",
                                                  tier[t]) for t in TIERS},
                    **{f"hit_tokens_{t}": count("kvloop:prefix_cache_hits", tier[t]) for t in TIERS})
    kinds = {k: count("kvloop:num_preemptions", f'{{kind="{k}"}}') for k in ("swap", "recompute")}
    return EngineSnapshot(
        num_waiting=count("kvloop:num_requests_waiting"), num_running=count("kvloop:num_requests_running"),
        batch_cap=count("kvloop:batch_cap"), num_preemptions=count("vllm:num_preemptions"),
        num_preemptions_by_kind=kinds, num_oom_events=count("kvloop:oom_events"),
        watermark=get("kvloop:retention_watermark"), kv_usage=get("vllm:kv_cache_usage_perc"), kv_stats=stats)


class HTTPTarget(Target):
    """flavor 'openai' (kvloop serve, vLLM, llama-server's /v1) or 'llamacpp' (/completion, which
    returns token ids and cache counts)."""

    def __init__(self, base_url: str, name: str, flavor: str = "openai", model: str | None = None,
                 scrape_metrics: bool = True, timeout_s: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.flavor = flavor
        self.model = model
        self.scrape_metrics = scrape_metrics and flavor == "openai"
        self._events: queue.Queue[Event] = queue.Queue()
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=512))

    def start(self) -> None:
        """OpenAI servers require `model`: take the first one /v1/models lists when none was given."""
        if self.flavor == "openai" and not self.model:
            try:
                self.model = self._client.get(self.base_url + "/v1/models",
                                              timeout=10).json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                self.model = "default"

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        with self._lock:
            self._live.add(request_id)
        threading.Thread(target=self._stream, args=(request_id, prompt, max_tokens), daemon=True).start()

    def _body(self, prompt: list[int], max_tokens: int) -> tuple[str, dict]:
        if self.flavor == "llamacpp":
            return "/completion", {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0,
                                   "ignore_eos": True,
                                   "stream": True, "cache_prompt": True, "return_tokens": True}
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        return "/v1/completions", body

    def _stream(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        path, body = self._body(prompt, max_tokens)
        done = Event(rid, 0.0, done=True, prompt_tokens=len(prompt),
                     cached_tokens=0 if self.flavor == "llamacpp" else None)
        n_out = 0
        try:
            with self._client.stream("POST", self.base_url + path, json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    kind = "rejected" if resp.status_code in (400, 413, 429, 503) else "http"
                    raise RuntimeError(f"{kind}: {resp.status_code} {resp.text[:200]}")
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    n_out += self._chunk(rid, json.loads(data), done)
        except Exception as e:  # noqa: BLE001 - any failure is this request's error, the run goes on
            msg = str(e)
            done.error = msg if msg.startswith(("rejected", "http")) else f"error: {type(e).__name__}: {msg}"
        done.t = time.monotonic()
        done.output_tokens = done.output_tokens or n_out
        self._events.put(done)

    def _chunk(self, rid: str, obj: dict, done: Event) -> int:
        """Queues a token event for a chunk with output; fills `done` from usage/timings. Returns tokens."""
        t = time.monotonic()
        if "error" in obj:
            raise RuntimeError(f"http: {obj['error']}")
        if self.flavor == "llamacpp":
            ids = list(obj.get("tokens") or [])
            n = len(ids) or (1 if obj.get("content") else 0)
            if obj.get("stop"):
                tim = obj.get("timings") or {}
                done.prompt_tokens = int(tim.get("prompt_n", 0) + tim.get("cache_n", 0)) or done.prompt_tokens
                done.cached_tokens = int(tim.get("cache_n", 0))
                done.output_tokens = int(tim.get("predicted_n", 0))
        else:
            choices = obj.get("choices") or []
            ids = []
            n = 1 if choices and choices[0].get("text") else 0
            usage = obj.get("usage")
            if usage:
                done.prompt_tokens = usage.get("prompt_tokens", done.prompt_tokens)
                done.output_tokens = usage.get("completion_tokens", 0)
                # None where the server gives no detail (vLLM without --enable-prompt-tokens-details):
                # unknown, not a miss, so the no-cache-hit TTFT is not computed from a guess
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                done.cached_tokens = None if cached is None else int(cached)
        if n:
            self._events.put(Event(rid, t, ids, n))
        return n

    def poll(self, timeout: float) -> list[Event]:
        out: list[Event] = []
        try:
            out.append(self._events.get(timeout=timeout) if timeout > 0 else self._events.get_nowait())
            while True:
                out.append(self._events.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            for ev in out:
                if ev.done:
                    self._live.discard(ev.request_id)
        return out

    def idle(self) -> bool:
        with self._lock:
            return not self._live and self._events.empty()

    def snapshot(self) -> EngineSnapshot | None:
        if not self.scrape_metrics:
            return None
        try:
            return kvloop_snapshot(parse_prometheus(self._client.get(self.base_url + "/metrics",
                                                                     timeout=5).text))
        except httpx.HTTPError:
            return None

    def info(self) -> dict:
        return {"url": self.base_url, "flavor": self.flavor}

    def close(self) -> None:
        self._client.close()
