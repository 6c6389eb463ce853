"""Converted weights cached on disk, so a warm start-up skips dequantizing, fusing and packing them.

Converting a GGUF model's weights (dequantize, un-permute q/k, fuse, pack for the linear kernels) took ~8 s
of a start-up on 2 shared cores for SmolLM2-135M; reading them back from this cache takes well under one
(sha256 of the file, then memory-mapped tensors). A cache file is keyed by everything the conversion's result
depends on: the checkpoint's fingerprint, the config, dtype, weight format, which CPU kernels are built, the
torch and gguf versions, and the source of the converting modules (a change to the packing layout is a new
key). A file whose checksum does not match (truncated, garbled, half written) is converted again with a log
line; a failure to read or write the cache never fails the engine, it only costs the conversion.

Only CPU models are cached (the file is memory-mapped as the model's own weights).
$KVLOOP_WEIGHT_CACHE: the directory (default cache_root()/weights), or "off"."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

import torch

from kvloop.engine.core.cache_root import cache_dir_from, prune_unused
from kvloop.engine.kernels.cpu import linear_bf16w, linear_int8w

log = logging.getLogger("kvloop.engine")

ENV = "KVLOOP_WEIGHT_CACHE"
# files (other models, formats, torch versions) not read for this long are removed on a write
UNUSED_DAYS = 14
# Conversion code: a change to any of these files changes what converting gives, hence the key.
_SOURCES = (Path(__file__).parent, Path(linear_bf16w.__file__), Path(linear_int8w.__file__))


def cache_dir() -> Path | None:
    """Where converted weights are cached, or None when caching is off."""
    return cache_dir_from(ENV, "weights")


def sources_digest(sources: Iterable[Path] = _SOURCES) -> str:
    """The code's fingerprint: every .py file of each folder in sources, and each file named."""
    digest = hashlib.sha256()
    for source in sources:
        for path in sorted(source.glob("*.py")) if source.is_dir() else [source]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def cache_key(model_class, fingerprint: str, cfg, dtype: torch.dtype, quantization: str,
              extra: Iterable[str] = ()) -> str:
    """What the converted weights depend on, hashed; `extra`: what a cache built on them depends on besides
    (runner/compiled_step.py keys its compiled step with this too)."""
    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "-"

    parts = [f"{model_class.__module__}.{model_class.__qualname__}", fingerprint, repr(cfg), str(dtype),
             quantization,
             f"bf16w={linear_bf16w.available()}", f"bf16w_native={linear_bf16w.native()}",
             f"bf16w_dense_above={linear_bf16w.dense_above_rows()}", f"int8w={linear_int8w.available()}",
             f"torch={torch.__version__}", f"gguf={version('gguf')}", sources_digest(), *extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:40]


def build_cached(model_class, fingerprint: str, cfg, weights: Mapping[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str, attention_backend: str, quantization: str):
    """model_class's model over the checkpoint's weights, its converted weights read from the cache when a
    valid file is there, else converted and written to it. model_class names its converted attributes in
    CONVERTED (and the classes they hold in CONVERTED_TYPES) and takes them back as `converted`."""
    root = cache_dir()
    if root is None or torch.device(device).type != "cpu":
        return model_class(cfg, weights, dtype, device, attention_backend, quantization)
    path = root / f"{cache_key(model_class, fingerprint, cfg, dtype, quantization)}.pt"
    started = time.perf_counter()
    converted = _read(path, model_class)
    if converted is not None:
        model = model_class(cfg, weights, dtype, device, attention_backend, quantization, converted=converted)
        log.info("weights: read the converted weights from the cache in %.1f s (%s)",
                 time.perf_counter() - started, path)
        return model
    model = model_class(cfg, weights, dtype, device, attention_backend, quantization)
    log.info("weights: converted in %.1f s", time.perf_counter() - started)
    _write(path, {name: getattr(model, name) for name in model_class.CONVERTED})
    return model


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read(path: Path, model_class) -> dict | None:
    """The cached converted weights, or None (missing, or unusable: logged)."""
    if not path.exists():
        return None
    try:
        expected = _checksum_path(path).read_text().strip()
        if _file_digest(path) != expected:
            raise ValueError("its checksum does not match")
        # weights_only: tensors and the model's own weight classes, no arbitrary pickled code
        with torch.serialization.safe_globals(list(model_class.CONVERTED_TYPES)):
            converted = torch.load(path, mmap=True, weights_only=True)
        if not isinstance(converted, dict) or set(converted) != set(model_class.CONVERTED):
            raise ValueError("it holds other parts than the model's")
        for used in (path, _checksum_path(path)):
            os.utime(used)  # in use: not pruned
        return converted
    except Exception as exc:  # noqa: BLE001 - a bad cache file costs a conversion, never the engine
        log.warning("weights: the cached weights in %s are unusable (%s: %s); converting them again",
                    path, type(exc).__name__, exc)
        return None


def _write(path: Path, converted: dict) -> None:
    """Writes the file and then its checksum, each through a temporary name: a reader sees either a whole
    pair or a mismatch (converted again), never a half-written file taken as good."""
    started = time.perf_counter()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(converted, tmp)
        digest = _file_digest(tmp)
        os.replace(tmp, path)
        tmp_sum = _checksum_path(tmp)
        tmp_sum.write_text(digest + "\n")
        os.replace(tmp_sum, _checksum_path(path))
    except Exception as exc:  # noqa: BLE001 - no cache costs the next start a conversion, nothing else
        log.warning("weights: could not cache the converted weights in %s (%s: %s)", path, type(exc).__name__,
                    exc)
        tmp.unlink(missing_ok=True)
        return
    log.info("weights: cached the converted weights in %.1f s (%s)", time.perf_counter() - started, path)
    prune_unused(path.parent, "*.pt*", UNUSED_DAYS, "weights")  # and leftover temporaries
