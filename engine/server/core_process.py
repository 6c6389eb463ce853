"""The engine core process: builds the EngineCore, then steps it and answers the API process over a pipe.

It runs the scheduler, the KV manager and the model steps, and owns the control block (the control hook
runs inside EngineCore.step, here). One thread does everything, so torch keeps one OpenMP pool. Each step's
outputs go back as one frame; the snapshot for /metrics at most every SNAPSHOT_INTERVAL_S and when idle.
TERM and INT are the API process's to handle (it drains, then sends Stop); a closed pipe (the API process
gone) ends this process too."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from kvloop.engine.server.async_engine import (
    EXIT_ENGINE_DEAD,
    IDLE_TICK_S,
    AbortRequest,
    AddRequest,
    add_to_engine,
)
from kvloop.engine.server.core_wire import (
    CallResult,
    CoreCall,
    CoreInfo,
    Died,
    Failed,
    Ready,
    Snapshot,
    Stop,
    encode_event,
    encode_outputs,
)

log = logging.getLogger("kvloop.core")
SNAPSHOT_INTERVAL_S = 0.05


class _PipeClosed(Exception):
    """The API process is gone."""


def build_engine_core(config):
    """The default builder: EngineCore(config)."""
    from kvloop.engine.engine_core import EngineCore

    return EngineCore(config)


def core_main(conn: Connection, build: Callable, config, warmup: bool, log_level: str = "INFO") -> None:
    """The process's entry point (multiprocessing spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s[core]: %(message)s")
    try:
        engine = build(config)
        engine.detokenize = False  # the API process detokenizes (front_output.py)
        # lazy import: the launcher's process must not need the engine's modules to spawn this one
        from kvloop.engine.server.launch import cache_config

        info = CoreInfo(engine.model_name, engine.scheduler.config.max_model_len,
                        engine.model_config.vocab_size,
                        cache_config(engine), os.getpid())
        conn.send_bytes(encode_event(info))
        CoreLoop(engine, conn).run(warmup)
    except _PipeClosed:
        log.info("the API process is gone: exiting")
    except BaseException as exc:  # noqa: BLE001 - a dead core must be visible, not silent
        log.exception("the engine core died")
        try:
            conn.send_bytes(encode_event(Died(f"engine stopped: {type(exc).__name__}: {exc}")))
        except OSError:
            pass
        logging.shutdown()
        os._exit(EXIT_ENGINE_DEAD)


class CoreLoop:
    def __init__(self, engine, conn: Connection):
        self.engine = engine
        self.conn = conn
        self._stop = False
        self._last_snapshot = 0.0

    def run(self, warmup: bool) -> None:
        if warmup:
            self.engine.warm_up()
        self._publish(force=True)
        self._send(encode_event(Ready()))
        eng = self.engine
        while not self._stop:
            self._drain_inbox()
            if self._stop:
                break
            if eng.has_unfinished():
                outputs = eng.step()
                if outputs:
                    self._send(encode_outputs(outputs))
                self._publish()
            else:
                self._publish(force=True)
                if not self._poll(IDLE_TICK_S):
                    # an empty step: the control block is still published and its targets polled
                    outputs = eng.step()
                    if outputs:
                        self._send(encode_outputs(outputs))
        if eng.control is not None:
            eng.control.close()

    def _poll(self, timeout: float) -> bool:
        try:
            return self.conn.poll(timeout)
        except (EOFError, OSError) as exc:
            raise _PipeClosed from exc

    def _send(self, frame: bytes) -> None:
        try:
            self.conn.send_bytes(frame)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _PipeClosed from exc

    def _drain_inbox(self) -> None:
        while self._poll(0):
            try:
                message = self.conn.recv()
            except EOFError as exc:
                raise _PipeClosed from exc
            match message:
                case AbortRequest(request_id, reason):
                    self.engine.abort(request_id, reason)
                case AddRequest() as add:
                    self._add(add)
                case CoreCall(call_id, fn):
                    try:
                        result = CallResult(call_id, True, fn(self.engine))
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        result = CallResult(call_id, False, exc)
                    self._send(encode_event(result))
                case Stop():
                    self._stop = True
                    return

    def _add(self, add: AddRequest) -> None:
        failure = add_to_engine(self.engine, add)
        if failure is not None:
            self._send(encode_event(Failed.of(add.request_id, failure)))

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._send(encode_event(Snapshot(self.engine.snapshot())))
            self._last_snapshot = now
