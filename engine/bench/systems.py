"""System names -> targets. A scheduler/KV mode is only a configuration of the in-process engine.

- static, continuous, continuous+lru, codesign: the engine, configured by `sizing.mode_configs`;
- transformers-static: transformers `generate` behind a StaticBatchGate;
- llama.cpp-bf16-np8 / -np32 (and -f32-): llama-server from scripts/build_llama_server.sh, prompt cache on;
- http:URL: any OpenAI-compatible endpoint already running."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import time
from pathlib import Path

from kvloop.engine.bench.sizing import ENGINE_MODES, Sizing, mode_configs
from kvloop.engine.bench.targets.base import Target
from kvloop.engine.bench.targets.static_gate import StaticBatchGate

ROOT = Path(__file__).resolve().parents[2]
LLAMA_DIR = Path(os.environ.get("KVLOOP_LLAMA_DIR", ROOT / ".tools" / "llama.cpp"))


def engine_target(mode: str, sizing: Sizing, threads: int | None = None) -> Target:
    from kvloop.engine.bench.targets.engine import EngineTarget
    from kvloop.engine.config import EngineConfig
    from kvloop.engine.engine_core import EngineCore

    sched, kv = mode_configs(mode, sizing)
    cfg = EngineConfig(kv_cache_tokens=sizing.kv_cache_tokens, scheduler=sched, kv=kv, threads=threads,
                       progress=False)
    return EngineTarget(EngineCore(cfg, checkpoint=_checkpoint()), mode)


@functools.cache
def _checkpoint():
    """Loaded once per process: every run gets a fresh engine (cold caches) without re-reading the GGUF."""
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import resolve_model_path

    return load_checkpoint(resolve_model_path(None), progress=False)


@functools.cache
def _hf_model(dtype: str):
    from kvloop.engine.bench.targets.hf import load_embedded

    return load_embedded(dtype)


def llama_server_bin() -> Path | None:
    p = LLAMA_DIR / "bin" / "llama-server"
    return p if p.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServerTarget(Target):
    """Starts llama-server on 127.0.0.1 for the run and stops it at close()."""

    def __init__(self, name: str, weights: str, parallel: int, sizing: Sizing, threads: int | None = None):
        from kvloop.engine.bench.targets.http import HTTPTarget

        binary = llama_server_bin()
        model = LLAMA_DIR / f"model-{weights}.gguf"
        if binary is None or not model.exists():
            raise FileNotFoundError(f"llama-server or {model.name} missing: run scripts/build_llama_server.sh")
        self.name = name
        self.port = _free_port()
        ctx = parallel * sizing.max_context
        self.cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "-np", str(parallel), "-c", str(ctx), "-t", str(threads or os.cpu_count() or 2),
                    "--cache-prompt", "-b", str(sizing.max_num_batched_tokens), "--no-webui"]
        self.proc: subprocess.Popen | None = None
        self.http = HTTPTarget(f"http://127.0.0.1:{self.port}", name, flavor="llamacpp")
        self.parallel = parallel
        self.weights = weights

    def start(self) -> None:
        if self.proc is not None:
            return
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"{self.name}.log", "w")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}); see {log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("llama-server did not become healthy in 120 s")

    def submit(self, request_id, prompt, max_tokens):
        self.http.submit(request_id, prompt, max_tokens)

    def poll(self, timeout):
        return self.http.poll(timeout)

    def idle(self):
        return self.http.idle()

    def info(self) -> dict:
        return {"impl": "llama.cpp llama-server", "weights": self.weights, "parallel": self.parallel,
                "cmd": " ".join(self.cmd)}

    def close(self) -> None:
        self.http.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


def missing_reason(name: str) -> str | None:
    """Why a system cannot run here (None: it can)."""
    if name.startswith("llama.cpp"):
        if llama_server_bin() is None:
            return "llama-server not built (scripts/build_llama_server.sh)"
        weights = name.split("-")[1]
        if not (LLAMA_DIR / f"model-{weights}.gguf").exists():
            return f"model-{weights}.gguf not converted"
    if name == "transformers-static":
        try:
            import transformers  # noqa: F401
        except ImportError:
            return "transformers not installed"
    return None


def make_target(name: str, sizing: Sizing, threads: int | None = None, hf_dtype: str = "float32") -> Target:
    if name in ENGINE_MODES:
        return engine_target(name, sizing, threads)
    if name == "transformers-static":
        from kvloop.engine.bench.targets.hf import HFGenerateTarget

        if threads:
            import torch

            torch.set_num_threads(threads)

        return StaticBatchGate(HFGenerateTarget(_hf_model(hf_dtype)), sizing.static_batch, sizing.fill_timeout_s,
                               name=name)
    if name.startswith("llama.cpp-"):  # llama.cpp-bf16-np8
        _, weights, np_ = name.split("-")
        return LlamaServerTarget(name, weights, int(np_.removeprefix("np")), sizing, threads)
    if name.startswith("http:"):
        from kvloop.engine.bench.targets.http import HTTPTarget

        return HTTPTarget(name[5:], name)
    raise ValueError(f"unknown system {name!r}")
