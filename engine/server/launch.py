"""`kvloop serve`: build the engine, wrap it, and run uvicorn. The heavy imports are inside the
functions, so that building the CLI parser stays cheap."""

from __future__ import annotations

import argparse
import logging
import os
import resource

from kvloop.engine.server.limits import ConnectionLimits

# below the kubelet's default terminationGracePeriodSeconds (30 s), leaving room for uvicorn's own exit
DEFAULT_SHUTDOWN_GRACE_S = 20.0
ENGINE_BACKENDS = ("process", "thread")
DEFAULT_ENGINE_BACKEND = "process"

def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-backend", choices=ENGINE_BACKENDS, default=DEFAULT_ENGINE_BACKEND,
                   help="process: the engine core (scheduler, KV manager, model steps, control block) in "
                        "its own process, the API process doing HTTP, tokenization, detokenization and "
                        "streaming; thread: the engine in a thread of the API process, sharing its "
                        "interpreter (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", action="append", default=None,
                   help="extra names the model answers to (default: 'default')")
    p.add_argument("--max-pending", type=int, default=256,
                   help="requests in flight before 429 (admission bound)")
    p.add_argument("--request-timeout", type=float, default=None, help="per-request deadline in seconds")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request bodies above this get 413")
    p.add_argument("--header-timeout", type=float, default=ConnectionLimits.header_timeout_s,
                   help="seconds a client has to send a request's line and headers, from connecting (or "
                        "from the first byte of a later request on a kept-alive connection); then 408 and "
                        "the close (default: %(default)s)")
    p.add_argument("--body-timeout", type=float, default=ConnectionLimits.body_timeout_s,
                   help="seconds a client has to send a request's whole body once its headers are in; "
                        "then the close (default: %(default)s)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds an idle connection is kept open between requests (default: %(default)s)")
    p.add_argument("--max-connections", type=int, default=ConnectionLimits.max_connections,
                   help="open connections beyond this get 503 with Retry-After and the close; the open-files "
                        "limit is raised to fit (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("KVLOOP_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $KVLOOP_API_KEY, else none)")
    p.add_argument("--allowed-origins", action="append", default=None, help="enable CORS for these origins")
    p.add_argument("--log-level", default="info")
    p.add_argument("--shutdown-grace", type=float, default=DEFAULT_SHUTDOWN_GRACE_S,
                   help="seconds from TERM to exit: in-flight requests get the first two thirds, the flush "
                        "of the KV cache to the disk tier the rest (keep it below "
                        "terminationGracePeriodSeconds)")


def cache_config(engine) -> dict:
    cfg = engine.config
    return {"block_size": cfg.block_size, "num_blocks": cfg.num_blocks,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "device": cfg.device, "max_num_seqs": cfg.scheduler.max_num_seqs,
            "max_num_batched_tokens": cfg.scheduler.max_num_batched_tokens,
            "max_model_len": cfg.scheduler.max_model_len, **_kv_config(cfg)}


def _kv_config(cfg) -> dict:
    kv = getattr(cfg, "kv", None)  # the KV manager's config, where it exists
    keys = ("mode", "admit_min_requests", "host_admit_min_requests", "disk_admit_min_requests",
            "min_prefix_tokens",
            "watermark", "host_cache_tokens", "disk_cache_tokens")
    out = {k: getattr(kv, k) for k in keys if hasattr(kv, k)}
    if kv is not None and hasattr(kv, "disk_dir"):
        out["disk_tier"] = bool(kv.disk_dir)
    return out


def metrics_model_name(file_model_name: str, served_names: list[str] | None) -> str:
    """The `model_name` label: the name clients ask for (the first served name other than the
    catch-all 'default'), else the model file's own name."""
    return next((n for n in served_names or [] if n != "default"), file_model_name)


def build_server(engine, args: argparse.Namespace, engine_thread=None):
    """The app and its AsyncEngine for an EngineCore (built on engine_thread, if given) and parsed serve
    arguments: the thread backend."""
    from kvloop.engine.server.async_engine import AsyncEngine

    async_engine = AsyncEngine(engine, None, max_pending=args.max_pending, engine_thread=engine_thread)
    return _assemble(async_engine, engine.model_name, cache_config(engine), args), async_engine


def build_process_server(engine_config, args: argparse.Namespace, build=None, tokenizer=None):
    """The app and its ProcessAsyncEngine: the engine core process started (build(engine_config) makes its
    EngineCore there; it must pickle) and built; it warms up once the app starts it."""
    from kvloop.engine.server.core_client import ProcessAsyncEngine
    from kvloop.engine.server.core_process import build_engine_core

    async_engine = ProcessAsyncEngine(engine_config, tokenizer, build or build_engine_core,
                                      max_pending=args.max_pending,
                                      log_level=getattr(args, "log_level", "info"))
    info = async_engine.launch()
    async_engine.tokenizer  # noqa: B018 - loaded now, not on the first request
    return _assemble(async_engine, info.model_name, info.cache_config, args), async_engine


def _assemble(async_engine, model_name: str, cache: dict, args: argparse.Namespace):
    from kvloop.engine.server.app import build_app
    from kvloop.engine.server.metrics import EngineMetrics
    from kvloop.engine.server.serving import ServerSettings

    metrics = EngineMetrics(metrics_model_name(model_name, args.served_model_name), async_engine.snapshot,
                            cache)
    async_engine.metrics = metrics
    settings = ServerSettings(request_timeout_s=args.request_timeout,
                              served_names=tuple(args.served_model_name or ["default"]))
    return build_app(async_engine, metrics, settings, api_key=args.api_key, cors_origins=args.allowed_origins,
                     max_body_bytes=args.max_body_bytes)


def uvicorn_config(app, args: argparse.Namespace, **overrides):
    """uvicorn's settings for kvloop serve: the guarded HTTP protocol (http_guard.py), the limits given."""
    import uvicorn

    from kvloop.engine.server.http_guard import guarded_protocol

    limits = ConnectionLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                              max_connections=args.max_connections)
    # after the drain only finished responses remain to be sent: uvicorn's own wait can be short
    settings = dict(host=args.host, port=args.port, log_level=args.log_level, http=guarded_protocol(limits),
                    timeout_keep_alive=args.keep_alive_timeout, timeout_graceful_shutdown=3)
    return uvicorn.Config(app, **{**settings, **overrides})


def raise_fd_limit(needed: int) -> None:
    """The soft open-files limit up to what max_connections needs (within the hard limit), as vLLM does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def serve(args: argparse.Namespace, engine_config) -> int:
    from kvloop.engine.engine_core import EngineCore
    from kvloop.engine.server.engine_thread import EngineThread
    from kvloop.engine.server.shutdown import DrainingServer

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if getattr(args, "engine_backend", DEFAULT_ENGINE_BACKEND) == "process":
        app, async_engine = build_process_server(engine_config, args)
    else:
        # loads, compiles and steps: one OpenMP pool (engine_thread.py says why)
        engine_thread = EngineThread()
        engine = engine_thread.call(EngineCore, engine_config)
        app, async_engine = build_server(engine, args, engine_thread)
    raise_fd_limit(args.max_connections + 256)  # room for the model's files, the disk tier, the pipes
    server = DrainingServer(uvicorn_config(app, args), async_engine, args.shutdown_grace)
    server.run()
    return 0 if server.started else 3  # 3: uvicorn's start-up failure code
