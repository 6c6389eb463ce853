"""The robustness matrix's systems on the CPU: live servers, one per system, that take the cells in turn.

A system is named `BASE[FLAGS]+key=value...`:
- BASE: `codesign` (`kvloop serve` + `kvloop sidecar` with their defaults, as `make serve` runs them: the
  engine's control block shared with the sidecar), any other `kvloop serve --mode` (continuous+lru, ...: the
  same server, no sidecar), or `vllm-cpu` (dtype bf16 where the CPU computes bf16 natively, else float32),
  `vllm-cpu-bf16`, `vllm-cpu-f32`;
- [FLAGS]: extra server flags, separated by spaces or commas (`codesign[--queue-order=work]`), passed as
  they are;
- +key=value: a sidecar setting written into its settings file (`codesign+law=goodput`; a dotted key nests:
  `+law.kv_band_low=0.5`; values read as YAML scalars); `+sidecar=off` runs codesign without the sidecar.
Flags and settings are strings here: whether the server or the sidecar accepts them is theirs to say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import yaml

from kvloop.engine.bench.kvloop_serve import KvloopServeTarget
from kvloop.engine.bench.systems import (
    OverHTTP,
    ServerProcessTarget,
    VllmCpuTarget,
    _free_port,
    missing_reason,
)
from kvloop.engine.bench.targets.http import HTTPTarget, parse_prometheus
from kvloop.engine.core import defaults as D
from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.core.policy import policy_names

VLLM = "vllm-cpu"
SIDECAR_MODE = "codesign"  # the mode `make serve` runs with its sidecar
_SPEC = re.compile(r"^(?P<base>[^\[]+?)(?:\[(?P<flags>[^\]]*)\])?(?P<settings>(?:\+[\w.]+=[^+\[\]]*)*)$")


@dataclass(frozen=True)
class SystemSpec:
    label: str  # as given on the command line: the name in the results
    base: str
    serve_flags: tuple[str, ...] = ()
    sidecar: dict = field(default_factory=dict)

    @property
    def is_vllm(self) -> bool:
        return self.base.startswith(VLLM)

    @property
    def with_sidecar(self) -> bool:
        return self.base == SIDECAR_MODE and str(self.sidecar.get("sidecar", "on")).lower() not in (
            "off", "false", "0")


def parse_system(label: str) -> SystemSpec:
    """`codesign[--queue-order=work]+law=goodput` -> its base, server flags and sidecar settings."""
    text = label.strip()
    bases = sorted([*policy_names(), VLLM, f"{VLLM}-bf16", f"{VLLM}-f32"], key=len, reverse=True)
    base = next((b for b in bases if text == b or text.startswith((b + "[", b + "+"))), None)
    m = _SPEC.match(text)
    if base is None or m is None or not m["base"].startswith(base):
        raise ValueError(f"bad system {label!r}: BASE[FLAGS]+key=value with BASE one of {', '.join(bases)}")
    rest = text[len(base):]
    m = _SPEC.match("x" + rest)
    if m is None or m["base"] != "x":
        raise ValueError(f"bad system {label!r}: BASE[FLAGS]+key=value")
    flags = tuple(f for f in re.split(r"[\s,]+", m["flags"] or "") if f)
    settings: dict = {}
    for part in filter(None, (m["settings"] or "").split("+")):
        key, value = part.split("=", 1)
        _nest(settings, key.split("."), yaml.safe_load(value) if value else "")
    if settings and base != SIDECAR_MODE:
        raise ValueError(f"{label!r}: sidecar settings need the {SIDECAR_MODE} base (the sidecar's pod)")
    return SystemSpec(text, base, flags, settings)


def _nest(d: dict, keys: list[str], value) -> None:
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def vllm_dtype(base: str) -> tuple[str, str]:
    """(vLLM --dtype, why) for a vllm-cpu base: bf16 where the CPU computes it natively, else float32."""
    if base.endswith("-bf16"):
        return "bfloat16", "named"
    if base.endswith("-f32"):
        return "float32", "named"
    caps = cpu_capabilities()
    native = caps.avx512_bf16 or caps.amx_bf16
    return ("bfloat16", "native bf16 on this CPU") if native else (
        "float32", "no native bf16 on this CPU (AVX2): bf16 would be emulated")


def missing(spec: SystemSpec) -> str | None:
    """Why the system cannot run here (None: it can)."""
    return missing_reason(f"{VLLM}-bf16") if spec.is_vllm else None


class PodTarget(KvloopServeTarget):
    """`kvloop serve` with its control block and, beside it, `kvloop sidecar` (scripts/serve_pod.sh)."""

    def __init__(self, name: str, args: list[str], settings: dict | None, with_sidecar: bool):
        stem = f"kvloop-matrix-control-{os.getpid()}-{_free_port()}"
        self.control = str(Path(tempfile.gettempdir()) / f"{stem}.bin")
        super().__init__(name, [*(["--control-file", self.control] if with_sidecar else []), *args])
        self.with_sidecar = with_sidecar
        self.settings = settings or {}
        self.sidecar: subprocess.Popen | None = None

    def start(self) -> None:
        super().start()
        if not self.with_sidecar or self.sidecar is not None:
            return
        cmd = [sys.executable, "-m", "kvloop.engine.cli", "sidecar", "--control", self.control,
               "--host", "127.0.0.1", "--port", str(_free_port())]
        if self.settings:
            path = Path(tempfile.gettempdir()) / f"{Path(self.control).stem}-sidecar.json"
            path.write_text(json.dumps(self.settings))
            cmd += ["--config", str(path)]
        log = open(Path(tempfile.gettempdir()) / f"{Path(self.control).stem}-sidecar.log", "w")
        self.sidecar = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.cmd_sidecar = cmd
        try:  # a setting the sidecar refuses ends it at once: say so rather than run codesign without it
            rc = self.sidecar.wait(3)
        except subprocess.TimeoutExpired:
            return
        self.sidecar = None
        raise RuntimeError(f"{self.name}: the sidecar exited ({rc}); log: {log.name}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and (
            not self.with_sidecar or (self.sidecar is not None and self.sidecar.poll() is None))

    def info(self) -> dict:
        return {**super().info(), "sidecar": " ".join(getattr(self, "cmd_sidecar", [])) or None,
                "sidecar_settings": self.settings}

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.terminate()
            try:
                self.sidecar.wait(10)
            except subprocess.TimeoutExpired:
                self.sidecar.kill()
            self.sidecar = None
        super().close()
        Path(self.control).unlink(missing_ok=True)


def start_server(spec: SystemSpec, sizing) -> ServerProcessTarget:
    """The system's server, started and ready (vLLM: about 80 s; kvloop: its load and step compile)."""
    if spec.is_vllm:
        dtype, _ = vllm_dtype(spec.base)
        server = VllmCpuTarget(spec.label, dtype, replace(sizing, max_context=D.MAX_MODEL_LEN.value))
        server.cmd += list(spec.serve_flags)
    else:
        mode = [] if spec.base == SIDECAR_MODE else ["--mode", spec.base]
        server = PodTarget(spec.label, [*mode, *spec.serve_flags], spec.sidecar, spec.with_sidecar)
    server.start()
    return server


class CellTarget(OverHTTP):
    """One cell's client against a running server: a fresh HTTP client per cell, the server left running."""

    def __init__(self, server: ServerProcessTarget):
        self.name = server.name
        self.server = server
        self.http = HTTPTarget(server.http.base_url, server.name, flavor="openai")

    def start(self) -> None:
        alive = getattr(self.server, "alive", lambda: self.server.proc is not None
                        and self.server.proc.poll() is None)
        if not alive():
            raise RuntimeError(f"{self.name}: the server (or its sidecar) is not running")
        self.http.start()

    def info(self) -> dict:
        return self.server.info()

    def close(self) -> None:
        self.http.close()  # any stream still open is cut: the server aborts it


def wait_server_idle(base_url: str, limit_s: float = 60.0) -> float:
    """Seconds until the server reports nothing running or waiting (kvloop's and vLLM's gauges alike), at
    most `limit_s`: the next cell must not start behind the last one's leftovers."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            m = parse_prometheus(httpx.get(base_url + "/metrics", timeout=5).text)
        except httpx.HTTPError:
            break
        busy = sum(v for k, v in m.items() if k.split("{")[0].endswith(("num_requests_running",
                                                                        "num_requests_waiting")))
        if busy == 0:
            break
        time.sleep(0.5)
    return time.monotonic() - t0
