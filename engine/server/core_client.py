"""The API process's end of the engine core process (core_process.py): an AsyncEngine whose engine runs
in a child process.

The event loop hands messages to a sender thread (a pipe write can block while the core is in a long step);
a reader thread turns the core's frames into the same event-loop calls the thread backend makes: one
_dispatch per step's outputs, _fail for a request the core could not add, the latest snapshot for /metrics.
If the core dies (an exception in its loop, or killed), /health answers 503 with the reason, requests in
flight fail, and this process exits with EXIT_ENGINE_DEAD so that it is restarted."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable

from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.server.async_engine import (
    DEATH_GRACE_S,
    EXIT_ENGINE_DEAD,
    AbortRequest,
    AsyncEngine,
    CallInEngine,
    EngineDead,
    RequestFailed,
)
from kvloop.engine.server.core_process import build_engine_core, core_main
from kvloop.engine.server.core_wire import (
    CallResult,
    CoreCall,
    CoreInfo,
    Died,
    Failed,
    Ready,
    Snapshot,
    Stop,
    decode,
)
from kvloop.engine.server.front_output import FrontOutput, params_for_core

log = logging.getLogger("kvloop.server")
START_TIMEOUT_S = 900.0  # building the core may compile the model step (over a minute on a large model)


class CoreStartFailed(RuntimeError):
    pass


class ProcessAsyncEngine(AsyncEngine):
    def __init__(self, config, tokenizer=None, build: Callable = build_engine_core, metrics=None,
                 max_pending: int = 256, exit_on_death: bool = True, log_level: str = "INFO"):
        super().__init__(None, metrics, max_pending, exit_on_death=exit_on_death)
        self._config, self._build, self._log_level = config, build, log_level
        self._tokenizer = tokenizer
        self.info: CoreInfo | None = None
        self.process: mp.process.BaseProcess | None = None
        self._conn = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._sender: threading.Thread | None = None
        self._front: dict[str, FrontOutput] = {}  # event-loop thread only: each request's detokenization

    # ---- facts the API needs ------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.info.model_name

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._config)
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def core_pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    # ---- lifecycle ----------------------------------------------------------------------------------
    def launch(self, warmup: bool = True, timeout: float = START_TIMEOUT_S) -> CoreInfo:
        """Starts the core process and waits until its engine is built (it warms up after that)."""
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads and torch state
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=core_main, name="kvloop-core", daemon=True,
                                   args=(child_conn, self._build, self._config, warmup, self._log_level))
        self.process.start()
        child_conn.close()
        end = time.monotonic() + timeout
        while not self._conn.poll(0.2):
            if not self.process.is_alive() or time.monotonic() > end:
                self.process.kill()
                code = self.process.exitcode
                raise CoreStartFailed(f"the engine core process did not start (exit code {code})")
        try:
            first = decode(self._conn.recv_bytes())
        except EOFError:
            first = None
        if not isinstance(first, CoreInfo):
            self.process.join(5)
            reason = first.reason if isinstance(first, Died) else f"exit code {self.process.exitcode}"
            raise CoreStartFailed(f"the engine core process failed to start: {reason}")
        self.info = first
        return first

    def start(self, loop: asyncio.AbstractEventLoop | None = None, warmup: bool = True) -> None:
        if self.process is None:
            self.launch(warmup)
        self._loop = loop or asyncio.get_running_loop()
        self._sender = threading.Thread(target=self._send_forever, name="kvloop-core-send", daemon=True)
        self._sender.start()
        self._thread = threading.Thread(target=self._read_forever, name="kvloop-core-read", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        if self.process is None:
            return
        self._outbox.put(Stop())
        self._outbox.put(None)  # then the sender ends
        self.process.join(timeout)
        if self.process.is_alive():
            log.warning("the engine core did not stop within %g s: killing it", timeout)
            self.process.kill()
            self.process.join(5)

    # ---- requests (event loop): detokenized here ------------------------------------------------------
    def _submit(self, group, rid: str, ids: list[int], params, user: str | None) -> None:
        self._front[rid] = FrontOutput(rid, params, self.tokenizer)
        super()._submit(group, rid, ids, params_for_core(params), user)

    def _abort(self, rid: str) -> None:
        self._front.pop(rid, None)
        super()._abort(rid)

    def _fail(self, rid: str, exc: BaseException) -> None:
        self._front.pop(rid, None)
        super()._fail(rid, exc)

    def _dispatch(self, outputs: list[RequestOutput], now: float) -> None:
        texts = []
        for out in outputs:
            rid = out.request_id
            front = self._front.get(rid)
            if front is None:
                continue  # aborted or failed meanwhile
            try:
                result, stopped_here = front.apply(out)
            except Exception as exc:  # noqa: BLE001 - this request's text, not the engine: it fails alone
                log.exception("request %s failed in output processing", rid)
                self._post(AbortRequest(rid, "error"))
                self._fail(rid,
                           RequestFailed(f"output processing failed: {type(exc).__name__}: {exc}", "output"))
                continue
            if result.finished:
                del self._front[rid]
                if stopped_here:  # a stop string: the core has not finished it, and judges it as stopped
                    self._post(AbortRequest(rid, "stop"))
            texts.append(result)
        super()._dispatch(texts, now)

    # ---- to the core --------------------------------------------------------------------------------
    def _post(self, message) -> None:
        if isinstance(message, CallInEngine):
            call_id = next(self._call_ids)
            self._calls[call_id] = message.future
            message = CoreCall(call_id, message.fn)
        self._outbox.put(message)

    def _send_forever(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the core is gone: the reader reports it
                return
            except Exception as exc:  # noqa: BLE001 - a call whose function does not pickle
                if isinstance(message, CoreCall):
                    self._calls.pop(message.call_id).set_exception(exc)
                else:
                    log.exception("could not send %s to the engine core", type(message).__name__)

    # ---- from the core (reader thread) --------------------------------------------------------------
    def _read_forever(self) -> None:
        while True:
            try:
                item = decode(self._conn.recv_bytes())
            except (EOFError, OSError):
                if not self._stop:
                    self.process.join(2)
                    self._core_died(f"engine stopped: the engine core process exited "
                                    f"(exit code {self.process.exitcode})")
                return
            if isinstance(item, list):
                self._call(self._dispatch, item, time.monotonic())
            else:
                self._on_event(item)

    def _on_event(self, event) -> None:
        match event:
            case Snapshot(snapshot):
                self._snapshot = snapshot
            case Failed() as failed:
                self._call(self._fail, failed.request_id, failed.exception())
            case CallResult(call_id, ok, value):
                future = self._calls.pop(call_id, None)
                if future is not None:
                    future.set_result(value) if ok else future.set_exception(value)
            case Ready():
                self.ready = True
            case Died(reason):
                self._stop = True  # the pipe closes next: this is the reason to report
                self._core_died(reason)

    def _core_died(self, reason: str) -> None:
        """/health turns 503 with the reason, in-flight requests fail, then the process exits non-zero."""
        log.error("the engine core died: %s", reason)
        self.dead = reason
        self.ready = False
        if self.metrics:
            self.metrics.observe_engine_death()
        for future in list(self._calls.values()):
            future.set_exception(EngineDead(reason))
        self._calls.clear()
        self._call(self._fail_all, reason)
        if self.exit_on_death:
            time.sleep(DEATH_GRACE_S)
            log.critical("exiting with status %d so that the server is restarted", EXIT_ENGINE_DEAD)
            logging.shutdown()
            os._exit(EXIT_ENGINE_DEAD)


def load_tokenizer(config):
    """The API process's own tokenizer, from the same model source the core loads."""
    from kvloop.engine.model.checkpoint import load_checkpoint
    from kvloop.engine.model.locate import resolve_model_path
    from kvloop.engine.tokenizer.tokenizer import Tokenizer

    checkpoint = load_checkpoint(resolve_model_path(config.model), progress=False)
    return Tokenizer.from_source(checkpoint.tokenizer_source)
