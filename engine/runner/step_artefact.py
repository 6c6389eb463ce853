"""The compiled step saved on disk (torch's AOT path: `torch.compile(...).aot_compile`, then the function's
serialized form), so a warm start-up loads the step's graph instead of dynamo tracing
the model's layers again.

One file per model and environment (CPU models only). Its key is the converted weights'
(model/weight_cache.py:
the checkpoint's fingerprint, config, dtype, weight format, which CPU kernels are built, torch, the model's
sources), plus what the compiled code depends on besides: the attention backend and KV dtype, the sources of
compiled_step.py and this file, Python, the CPU's flags, torch's thread count (inductor writes it into its
OpenMP loops) and inductor's options and configuration. The graph reads the weights through the model it is
loaded for (its external data), so the values are not in the file; the fingerprint stands for their layout.
A file is its payload's sha256 and the payload, written under a temporary name and renamed: a reader never
takes a half-written file for good. A file that fails its checksum or does not load is removed with a log
line, and the step is compiled (and saved) again.

The payload is a pickle, like inductor's own cache entries: it is only read from this cache's folder.
$KVLOOP_COMPILED_STEP_CACHE: the directory (default cache_root()/compiled-steps), or "off"."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from kvloop.engine.core.cache_root import cache_dir_from, prune_unused
from kvloop.engine.core.cpu import cpu_capabilities
from kvloop.engine.model.weight_cache import cache_key, sources_digest

log = logging.getLogger("kvloop.compile")

ENV = "KVLOOP_COMPILED_STEP_CACHE"
UNUSED_DAYS = 14  # files (other models, versions, sources) not read for this long are removed on a write
SUFFIX = ".step"
_DIGEST_BYTES = 64  # the payload's sha256 in hex, then a newline, then the payload


def cache_dir() -> Path | None:
    """Where compiled steps are saved, or None when saving them is off."""
    return cache_dir_from(ENV, "compiled-steps")


def artefact_key(model, fingerprint: str, kv_dtype: torch.dtype,
                 inductor_options: Mapping[str, object]) -> str:
    import torch._inductor.config as inductor_config  # the compile imports it anyway

    from kvloop.engine.runner import compiled_step

    portable_config = sorted(inductor_config.save_config_portable().items())
    inductor_config_digest = hashlib.sha256(repr(portable_config).encode())
    extra = [f"attention={model.attention.name}", f"kv={kv_dtype}", f"cpu={cpu_capabilities().cache_key}",
             sources_digest([Path(compiled_step.__file__), Path(__file__)]), f"python={sys.version}",
             f"threads={torch.get_num_threads()}", f"inductor={sorted(inductor_options.items())}",
             f"inductor_config={inductor_config_digest.hexdigest()}"]
    return cache_key(type(model), fingerprint, model.cfg, model.dtype, model.quantization, extra)


def artefact_path(model, fingerprint: str, kv_dtype: torch.dtype,
                  inductor_options: Mapping[str, object]) -> Path | None:
    """The file for this model's compiled step here, or None: saving is off, the checkpoint is unknown (a
    model built in-process has no fingerprint to tell its weights' layout by), or the model is not on the CPU
    (the only device whose compiled step is measured)."""
    root = cache_dir()
    if root is None or not fingerprint or model.device.type != "cpu":
        return None
    return root / f"{artefact_key(model, fingerprint, kv_dtype, inductor_options)}{SUFFIX}"


def load(path: Path, external_data: dict[str, object]):
    """The compiled step saved in path (torch's AOTCompiledFunction), its external objects bound to
    external_data; None when there is no file, or when it is unusable (then removed, logged)."""
    if not path.exists():
        return None
    try:
        step = torch.compiler.load_compiled_function(io.BytesIO(payload(path)), external_data=external_data)
        os.utime(path)  # in use: not pruned
        return step
    except Exception as exc:  # noqa: BLE001 - a bad file costs a compile, never the engine
        discard(path, exc)
        return None


def payload(path: Path) -> bytes:
    """The file's payload, checked against its sha256 (a ValueError when they differ: truncated, garbled)."""
    data = path.read_bytes()
    body = data[_DIGEST_BYTES + 1:]
    if data[:_DIGEST_BYTES] != hashlib.sha256(body).hexdigest().encode():
        raise ValueError("its checksum does not match")
    return body


def discard(path: Path, why: BaseException) -> None:
    """Removes an unusable saved step (the caller compiles it again)."""
    first = (str(why).strip().splitlines() or [""])[0]
    log.warning("compile: the saved step %s is unusable (%s: %s); removed, compiling the step again",
                path, type(why).__name__, first)
    path.unlink(missing_ok=True)


def save(path: Path, step, external_data: dict[str, object]) -> None:
    """Writes the compiled step to path through a temporary name; a failure is logged, never raised."""
    started = time.perf_counter()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        payload = type(step).serialize(step, external_data).serialized_data
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - an unsaved step costs the next start a compile, nothing else
        log.warning("compile: could not save the compiled step in %s (%s: %s)", path, type(exc).__name__, exc)
        tmp.unlink(missing_ok=True)
        return
    log.info("compile: saved the compiled step in %.1f s (%s, %d kB)", time.perf_counter() - started, path,
             path.stat().st_size // 1024)
    prune_unused(path.parent, f"*{SUFFIX}*", UNUSED_DAYS, "compile")  # and leftover temporaries
