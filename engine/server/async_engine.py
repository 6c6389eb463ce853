"""Runs the (not thread-safe) EngineCore in one engine thread (the one that built it, where given: see
engine_thread.py) and bridges it to asyncio.

The event loop talks to the thread only through a deque inbox of typed messages (AddRequest, AbortRequest,
CallInEngine) and an Event that wakes it.
The thread sends each step's outputs back with a single call_soon_threadsafe, which routes them to
per-request-group asyncio queues. Torch releases the GIL inside its kernels, so the API stays responsive
during long prefills (measured against a separate engine process: see bench/results/api.md)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvloop.engine.core.sampling import SamplingParams
from kvloop.engine.core.snapshot import EngineSnapshot
from kvloop.engine.output_processor import RequestOutput
from kvloop.engine.server.engine_thread import EngineThread
from kvloop.engine.server.metrics import EngineMetrics

log = logging.getLogger("kvloop.server")
# While idle the engine thread still takes an empty step this often: the control hook publishes the snapshot
# and polls the sidecar's targets after every step, so the sidecar (stale after 5 s) sees a live engine.
IDLE_TICK_S = 0.5
EXIT_ENGINE_DEAD = 70  # EX_SOFTWARE: the process exits with it when the engine thread dies
DEATH_GRACE_S = 1.0  # time for the failed requests' errors to reach their clients before that exit


class Overloaded(Exception):
    """More requests in flight than the server admits; the API answers 429."""


class RequestFailed(Exception):
    """The engine gave up on one request. stage None: the scheduler could not place it (static mode out of
    memory); "step": the model step it was in failed (both 503, retryable); else the stage where it failed
    alone (sampling, a logits processor, output processing)."""

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


class ShuttingDown(RequestFailed):
    """The server got TERM and its grace period ran out before this request finished (503)."""

    reason = "shutting_down"


class EngineDead(Exception):
    """The engine thread stopped (a bug or a fatal error); the API answers 503."""


# ---- the engine thread's inbox: one message kind per operation the event loop asks of it -----------------
@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    user: str | None
    arrival: float  # time.monotonic() when the API call submitted it


def add_to_engine(engine, add: AddRequest) -> Exception | None:
    """Adds the request to the engine (either backend's loop); the exception its client is to get where it
    could not be added: a refusal as it is, anything else as this request's failure, never the engine's."""
    try:
        engine.add_request(add.request_id, add.prompt_token_ids, add.params, user=add.user,
                           arrival_time=add.arrival)
    except ValueError as exc:  # RequestRejected is a ValueError too
        return exc
    except Exception as exc:  # noqa: BLE001 - one request's fault, not the engine's
        log.exception("adding request %s failed", add.request_id)
        return RequestFailed(f"the engine could not add this request: {exc}", "add")
    return None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str
    # "abort": the client's choice, not judged against the SLO. The process backend's API process ends a
    # request itself on a stop string ("stop") or a failure of its output processing ("error"): the core
    # counts those as the thread backend's engine would have.
    reason: str = "abort"


@dataclass(frozen=True)
class CallInEngine:
    """fn(engine_core) between steps; its result or exception goes to future."""

    fn: Callable
    future: concurrent.futures.Future


InboxMessage = AddRequest | AbortRequest | CallInEngine


@dataclass
class _Member:
    group: RequestGroup
    num_prompt_tokens: int
    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    output_tokens: int = 0
    first_scheduled: float | None = None


class RequestGroup:
    """The engine requests behind one API call (n choices, several prompts) sharing one queue."""

    def __init__(self, engine: AsyncEngine):
        self._engine = engine
        self.queue: asyncio.Queue[tuple[str, RequestOutput | BaseException]] = asyncio.Queue()
        self.unfinished: set[str] = set()

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
            user: str | None) -> None:
        self._engine._submit(self, request_id, prompt_token_ids, params, user)
        self.unfinished.add(request_id)

    async def next(self) -> tuple[str, RequestOutput | BaseException]:
        rid, item = await self.queue.get()
        if isinstance(item, BaseException) or item.finished:
            self.unfinished.discard(rid)
        return rid, item

    def close(self) -> None:
        """Aborts whatever has not finished (client gone, deadline, error). Idempotent."""
        for rid in list(self.unfinished):
            self._engine._abort(rid)
        self.unfinished.clear()


class AsyncEngine:
    def __init__(self, engine, metrics: EngineMetrics | None = None, max_pending: int = 256,
                 snapshot_interval_s: float = 0.05, exit_on_death: bool = True,
                 engine_thread: EngineThread | None = None):
        self.engine = engine
        # the thread that built the engine, if one did: stepping there keeps one
        # OpenMP pool (engine_thread.py)
        self._engine_thread = engine_thread
        # A dead engine thread leaves a process that answers only 503: exit so the kubelet (or `make serve`)
        # restarts it. In-process test servers turn this off.
        self.exit_on_death = exit_on_death
        self.metrics = metrics
        self.max_pending = max_pending
        self._snapshot_interval = snapshot_interval_s
        self._inbox: deque[InboxMessage] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._members: dict[str, _Member] = {}  # event-loop thread only
        self._snapshot: EngineSnapshot | None = None  # the latest, published by the engine thread
        self._last_snapshot = 0.0
        self.ready = False
        self.dead: str | None = None
        self.draining = False  # TERM received: no new requests (engine.server.shutdown)

    # ---- facts the API needs, safe to read from any thread ---------------------------------------
    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.scheduler.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.model_config.vocab_size

    @property
    def num_in_flight(self) -> int:
        return len(self._members)

    def snapshot(self) -> EngineSnapshot | None:
        return self._snapshot

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None, warmup: bool = True) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._thread = self._engine_thread or EngineThread()
        self._thread.submit(self._run, warmup)
        self._thread.finish()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- shutdown (TERM; engine.server.shutdown drives these from the event loop) ---------------------
    def stop_admitting(self) -> None:
        """/ready and new requests answer 503 from now on, so the kubelet stops routing here."""
        self.draining = True
        self.ready = False

    def fail_in_flight(self, reason: str) -> int:
        """Fails what is still in flight when the grace period is over. The engine aborts them, so their
        full blocks are released into the prefix cache (and reach the disk flush). Returns how many."""
        rids = list(self._members)
        for rid in rids:
            self._post(AbortRequest(rid))
            self._fail(rid, ShuttingDown(reason))
        return len(rids)

    def new_group(self) -> RequestGroup:
        if self.dead:
            raise EngineDead(self.dead)
        return RequestGroup(self)

    def call_in_engine(self, fn: Callable) -> concurrent.futures.Future:
        """Runs fn(engine_core) on the engine thread between steps (integrity checks, live knobs)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post(CallInEngine(fn, future))
        return future

    def check_capacity(self, count: int) -> None:
        if len(self._members) + count > self.max_pending:
            if self.metrics:
                self.metrics.observe_rejected("queue_full")
            raise Overloaded(f"the server has {len(self._members)} requests in flight (limit "
                             f"{self.max_pending})")

    # ---- event-loop side --------------------------------------------------------------------------
    def _post(self, message: InboxMessage) -> None:
        """Hands one message to the engine (here: its thread's inbox; the process backend sends it)."""
        self._inbox.append(message)
        self._wake.set()

    def _submit(self, group: RequestGroup, rid: str, ids: list[int], params: SamplingParams,
                user: str | None):
        arrival = time.monotonic()
        self._members[rid] = _Member(group, len(ids), arrival)
        self._post(AddRequest(rid, ids, params, user, arrival))

    def _abort(self, rid: str) -> None:
        member = self._members.pop(rid, None)
        if member is None:
            return
        self._post(AbortRequest(rid))
        if self.metrics:
            now = time.monotonic()
            queue_s = None if member.first_scheduled is None else member.first_scheduled - member.arrival
            self.metrics.observe_finished("abort", member.num_prompt_tokens, member.output_tokens,
                                          now - member.arrival, queue_s)

    def _dispatch(self, outputs: list[RequestOutput], now: float) -> None:
        m = self.metrics
        for out in outputs:
            member = self._members.get(out.request_id)
            if member is None:
                continue  # aborted meanwhile
            if out.new_token_ids or out.finished:
                if member.first_token is None:
                    member.first_token = now
                    if m and out.first_token_time is not None:
                        m.observe_first_token(out.first_token_time - out.arrival_time)
                elif m:
                    m.observe_token_gap(now - member.last_token)
                member.last_token = now
            if out.finished and out.finish_reason == "error":  # failed alone, in the scheduler or the step
                del self._members[out.request_id]
                if m:
                    if out.error_stage is None:
                        m.observe_rejected("engine_error")
                    else:
                        m.observe_request_failure(out.error_stage)
                failure = RequestFailed(out.error or "the engine failed", out.error_stage)
                member.group.queue.put_nowait((out.request_id, failure))
                continue
            member.output_tokens = out.num_output_tokens
            member.first_scheduled = out.first_scheduled_time
            if out.finished:
                del self._members[out.request_id]
                if m:
                    end = out.finished_time or now
                    started = out.first_scheduled_time
                    queue_s = None if started is None else started - out.arrival_time
                    m.observe_finished(out.finish_reason or "stop", out.num_prompt_tokens,
                                       out.num_output_tokens,
                                       end - out.arrival_time, queue_s)
            member.group.queue.put_nowait((out.request_id, out))

    def _fail(self, rid: str, exc: BaseException) -> None:
        member = self._members.pop(rid, None)
        if member is not None:
            if self.metrics and getattr(exc, "stage", None) is not None:  # failed alone, while being added
                self.metrics.observe_request_failure(exc.stage)
            elif self.metrics:
                self.metrics.observe_rejected(getattr(exc, "reason", "invalid"))
            member.group.queue.put_nowait((rid, exc))

    def _fail_all(self, reason: str) -> None:
        for rid in list(self._members):
            self._fail(rid, EngineDead(reason))

    # ---- engine thread ----------------------------------------------------------------------------
    def _call(self, fn: Callable, *args) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _run(self, warmup: bool) -> None:
        try:
            if warmup:
                self.engine.warm_up()
            self._publish(force=True)
            self.ready = True
            self._loop_forever()
        except BaseException as exc:  # noqa: BLE001 - a dead engine must be visible, not silent
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """/health turns 503 with the reason, in-flight requests fail, then the process exits non-zero."""
        log.exception("engine thread died")
        self.dead = f"engine stopped: {type(exc).__name__}: {exc}"
        self.ready = False
        if self.metrics:
            self.metrics.observe_engine_death()
        self._call(self._fail_all, self.dead)
        if self.exit_on_death:
            time.sleep(DEATH_GRACE_S)
            log.critical("exiting with status %d so that the server is restarted", EXIT_ENGINE_DEAD)
            logging.shutdown()
            os._exit(EXIT_ENGINE_DEAD)  # not sys.exit: that ends this thread only


    def _loop_forever(self) -> None:
        eng = self.engine
        while not self._stop:
            self._wake.clear()
            self._drain_inbox()
            if eng.has_unfinished():
                outputs = eng.step()
                if outputs:
                    self._call(self._dispatch, outputs, time.monotonic())
                self._publish()
            else:
                self._publish(force=True)
                if not self._wake.wait(IDLE_TICK_S):
                    # an empty step: the control block still gets published and polled, from this thread
                    eng.step()

    def _drain_inbox(self) -> None:
        eng = self.engine
        while self._inbox:
            match self._inbox.popleft():
                case AbortRequest(request_id, reason):
                    eng.abort(request_id, reason)
                case CallInEngine(fn, future):
                    try:
                        future.set_result(fn(eng))
                    except Exception as exc:  # noqa: BLE001 - handed to the caller
                        future.set_exception(exc)
                case AddRequest() as add:
                    self._add(add)

    def _add(self, add: AddRequest) -> None:
        failure = add_to_engine(self.engine, add)
        if failure is not None:
            self._call(self._fail, add.request_id, failure)

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_snapshot >= self._snapshot_interval:
            self._snapshot = self.engine.snapshot()
            self._last_snapshot = now
