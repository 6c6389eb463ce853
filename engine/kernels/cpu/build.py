"""Builds and loads the CPU kernels (csrc/ beside this file) with torch's extension tools: each csrc/NAME.cpp
is its own library, kvloop_cpu_NAME.so, registering its operators under torch.ops.kvloop_cpu (one source's
edit or compile error leaves the others alone).

They are compiled once, at install time (`python -m kvloop.engine.kernels.cpu.build`, run by `make install`),
into a cache directory inside the virtual environment, keyed by the source and the headers, the compiler
flags, torch's version and the CPU (core/cpu.py's cache_key: -march=native compiles for this CPU), so that a
changed source or another machine gets a fresh build and a stale one is never loaded. The engine only loads
finished builds: it never compiles on a user's request; without one (no compiler, a failed build) it logs why
and the torch path serves.

    python -m kvloop.engine.kernels.cpu.build   # build (or find) every kernel and print where it is

KVLOOP_CPU_KERNEL_DIR overrides the cache directory."""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kvloop.engine.core.cache_root import cache_root as kvloop_cache_root
from kvloop.engine.core.cpu import cpu_capabilities

log = logging.getLogger("kvloop.kernels")

CSRC = Path(__file__).resolve().parent / "csrc"
# Built on the machine that runs it: -march=native picks AVX2/FMA/F16C (or AVX-512, AMX) where present.
# Tuples, passed as copies: cpp_extension.load appends to the lists it is given (changing the build key).
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)
ATTENTION = "paged_decode"  # the attention kernel's source, csrc/paged_decode.cpp
# Called once a kernel's library is loaded, whoever loads it and whatever was imported before: registers
# its operators' fake (meta) implementations, the output shapes torch.compile traces through without data.
ON_LOAD = {
    "paged_decode": "kvloop.engine.kernels.cpu.paged_decode:register_fakes",
    "linear_bf16w": "kvloop.engine.kernels.cpu.linear_bf16w:on_load",
    "linear_int8w": "kvloop.engine.kernels.cpu.linear_int8w:register_fakes",
    "linear_onednn": "kvloop.engine.kernels.cpu.linear_onednn:register_fakes",
}


@dataclass
class _State:
    loaded: bool = False
    error: str | None = None  # why it is not loaded
    build_seconds: float | None = None  # set when this process compiled it


_states: dict[str, _State] = {}


def kernels() -> list[str]:
    """Every kernel source's name (csrc/NAME.cpp)."""
    return sorted(p.stem for p in CSRC.glob("*.cpp"))


def digest(kernel: str) -> str:
    """What a build depends on: its source and the headers, flags, torch, Python and the CPU."""
    h = hashlib.sha256()
    for path in [CSRC / f"{kernel}.cpp", *sorted(CSRC.glob("*.h"))]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for part in (*CFLAGS, *LDFLAGS, torch.__version__, sys.version.split()[0], cpu_capabilities().cache_key):
        h.update(part.encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    if os.environ.get("KVLOOP_CPU_KERNEL_DIR"):
        return Path(os.environ["KVLOOP_CPU_KERNEL_DIR"])
    return kvloop_cache_root() / "cpu-kernels"  # in the virtual environment: the build lives and dies with it


def library_name(kernel: str) -> str:
    return f"kvloop_cpu_{kernel}"


def library_path(kernel: str = ATTENTION) -> Path:
    return cache_root() / f"{library_name(kernel)}-{digest(kernel)}" / f"{library_name(kernel)}.so"


def load(kernel: str = ATTENTION, build: bool = False) -> bool:
    """Registers the kernel's operators (torch.ops.kvloop_cpu) from its cached build, and their fakes
    (ON_LOAD); True when available. build=True compiles a missing build first (the install step and the
    tests); the engine passes False and is told once, in the log, why a kernel is unavailable."""
    state = _states.setdefault(kernel, _State())
    if state.loaded:
        return True
    if state.error is not None and not build:
        return False
    try:
        path = library_path(kernel)
        if path.exists():
            torch.ops.load_library(str(path))
        elif build:
            state.build_seconds = _compile(kernel, path.parent)
        else:
            raise FileNotFoundError(f"not built for this machine and sources (run `{sys.executable} -m "
                                    f"kvloop.engine.kernels.cpu.build`)")
        if kernel in ON_LOAD:
            module, func = ON_LOAD[kernel].split(":")
            getattr(importlib.import_module(module), func)()
    except Exception as exc:  # no compiler, no ninja, a compile error: the torch path serves instead
        state.error = f"{type(exc).__name__}: {exc}".strip()
        log.warning("CPU kernel %s unavailable, the torch path serves instead: %s", kernel, state.error)
        return False
    state.loaded, state.error = True, None
    return True


def unavailable_reason(kernel: str = ATTENTION) -> str | None:
    state = _states.get(kernel, _State(error="not loaded"))
    return None if state.loaded else state.error


def simd() -> str:
    """The instruction set the attention kernel was compiled for ("avx2+fma+f16c", "scalar", ...)."""
    return torch.ops.kvloop_cpu.simd()


def blocked_bf16() -> bool:
    """Whether the attention kernel was built with its blocked bf16 path (AVX-512 with AVX512-BF16)."""
    return torch.ops.kvloop_cpu.blocked_bf16()


def _compile(kernel: str, target: Path) -> float:
    from torch.utils import cpp_extension

    target.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.info("compiling CPU kernel %s into %s", kernel, target)
    # loads the library when done; a file lock in `target` keeps concurrent builds of it apart
    cpp_extension.load(library_name(kernel), [str(CSRC / f"{kernel}.cpp")], extra_cflags=list(CFLAGS),
                       extra_ldflags=list(LDFLAGS), extra_include_paths=[str(CSRC)],
                       build_directory=str(target),
                       is_python_module=False, verbose=False)
    took = time.perf_counter() - started
    log.info("CPU kernel %s built in %.1f s", kernel, took)
    for old in target.parent.glob(f"{library_name(kernel)}-*"):  # builds of earlier sources or flags
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return took


def main() -> int:
    """Builds every kernel; exit status 1 when one could not be built (the engine then
    uses the torch path)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    failed = 0
    for kernel in kernels():
        if not load(kernel, build=True):
            print(f"kvloop: CPU kernel {kernel} not built ({unavailable_reason(kernel)}); the torch path "
                  "serves")
            failed += 1
            continue
        took = _states[kernel].build_seconds
        how = f"built in {took:.1f} s" if took is not None else "already built"
        print(f"kvloop: CPU kernel {kernel} {how}: {library_path(kernel)}")
    if load(ATTENTION):
        print(f"kvloop: CPU attention kernel compiled for {simd()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
