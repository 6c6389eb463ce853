"""Measurement prototype: the engine in a separate process instead of a thread of the API process.

Same interface as kvloop.engine.server.async_engine.AsyncEngine (it subclasses it): the engine thread is
replaced by a reader thread that forwards ops to a child process over a pipe and hands each step's
outputs (pickled) back to the event loop. Used by bench/api.py to choose thread vs process by
measurement; the server ships the thread backend."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from kvloop.engine.server.async_engine import AsyncEngine


def _child(conn, config) -> None:
    from kvloop.engine.engine_core import EngineCore

    engine = EngineCore(config)
    conn.send(("meta", engine.model_name, engine.scheduler.config.max_model_len, engine.model_config.vocab_size))
    while True:
        busy = engine.has_unfinished()
        while conn.poll(0 if busy else 0.5):
            op = conn.recv()
            if op[0] == "stop":
                return
            if op[0] == "abort":
                engine.abort(op[1])
            else:
                _, rid, ids, params, user = op
                try:
                    engine.add_request(rid, ids, params, user=user)
                except ValueError as exc:
                    conn.send(("fail", rid, exc))
            busy = engine.has_unfinished()
        if busy:
            outputs = engine.step()
            if outputs:
                conn.send(("out", outputs, engine.snapshot()))


class _Meta:
    """What the API layer reads from `engine`: names and limits, plus the tokenizer (built here)."""

    def __init__(self, name: str, max_model_len: int, vocab: int, tokenizer):
        self.model_name, self.tokenizer = name, tokenizer

        class _Cfg:
            pass

        self.scheduler = _Cfg()
        self.scheduler.config = _Cfg()
        self.scheduler.config.max_model_len = max_model_len
        self.model_config = _Cfg()
        self.model_config.vocab_size = vocab


class ProcessAsyncEngine(AsyncEngine):
    def __init__(self, config, tokenizer, metrics=None, max_pending: int = 256):
        super().__init__(None, metrics, max_pending)
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child, args=(child_conn, config), daemon=True)
        self._proc.start()
        _, name, max_len, vocab = self._conn.recv()
        self.engine = _Meta(name, max_len, vocab, tokenizer)
        self._send_lock = threading.Lock()

    def _send(self, op) -> None:
        with self._send_lock:
            self._conn.send(op)

    def _submit(self, group, rid, ids, params, user):
        from kvloop.engine.server.async_engine import _Member

        self._members[rid] = _Member(group, len(ids), time.monotonic())
        self._send(("add", rid, ids, params, user))

    def _abort(self, rid):
        if self._members.pop(rid, None) is not None:
            self._send(("abort", rid))

    def _run(self, warmup: bool) -> None:  # the reader thread
        self.ready = True
        while not self._stop:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                self.dead = "engine process exited"
                self.ready = False
                self._call(self._fail_all, self.dead)
                return
            if msg[0] == "out":
                self._snapshot = msg[2]
                self._call(self._dispatch, msg[1], time.monotonic())
            elif msg[0] == "fail":
                self._call(self._fail, msg[1], msg[2])

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        self._proc.join(timeout)
