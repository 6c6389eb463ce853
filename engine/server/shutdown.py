"""Graceful shutdown on TERM (what the kubelet sends) or Ctrl-C: stop admitting, let in-flight requests
finish within a grace period, fail the rest, flush the KV cache to the disk tier, then let uvicorn exit 0.

uvicorn's own TERM handling closes the listening socket at once and gives requests a fixed few seconds;
here the socket stays open while draining, so probes and late requests get a clear 503 (the kubelet
takes a moment to stop routing) instead of a refused connection. A second signal forces uvicorn's exit."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time

import uvicorn

from kvloop.engine.server.async_engine import AsyncEngine

log = logging.getLogger("kvloop.server")
FLUSH_SHARE = 1 / 3  # of the grace period kept back from in-flight requests for the disk flush
POLL_S = 0.05
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def persist_disk_tier(deadline: float, core) -> dict:
    """In the engine (a partial of it pickles to the core process): time.monotonic() is one clock across
    processes on Linux, so the deadline holds there too."""
    return core.kv.persist(deadline)


async def graceful_shutdown(engine: AsyncEngine, grace_s: float) -> dict:
    """Drains `engine` within grace_s seconds; returns what happened (for the log and tests)."""
    start = time.monotonic()
    deadline = start + grace_s
    engine.stop_admitting()
    requests_deadline = deadline - grace_s * FLUSH_SHARE
    while engine.num_in_flight and time.monotonic() < requests_deadline:
        await asyncio.sleep(POLL_S)  # in-flight requests finish on their own; nothing to await per request
    failed = engine.fail_in_flight(f"the server is shutting down (grace period of {grace_s:g} s over)")
    flush: dict = {}
    if not engine.dead:
        # on the engine thread, after the aborts above (the inbox is ordered), so their blocks are cached
        future = engine.call_in_engine(functools.partial(persist_disk_tier, deadline))
        try:
            flush = await asyncio.wait_for(asyncio.wrap_future(future),
                                           max(0.0, deadline - time.monotonic()) + 1.0)
        except TimeoutError:
            flush = {"error": "the engine did not answer within the grace period"}
        except Exception as exc:  # noqa: BLE001 - a failed flush must not keep the process from exiting
            flush = {"error": f"{type(exc).__name__}: {exc}"}
    return {"failed_requests": failed, "seconds": round(time.monotonic() - start, 3), **flush}


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first TERM or INT drains the engine (graceful_shutdown) before exiting."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, grace_s: float):
        super().__init__(config)
        self.engine = engine
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_requested = False
        self._drain: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if sig in DRAIN_SIGNALS and self._loop is not None and not self.should_exit:
            if not self._drain_requested:
                self._drain_requested = True
                # a signal handler must not touch the loop directly; call_soon_threadsafe also wakes it
                self._loop.call_soon_threadsafe(self._start_drain, sig)
                return
            # e.g. Ctrl-C in serve_pod.sh: INT from the terminal, TERM from the script
            if sig == signal.SIGTERM:
                return
        super().handle_exit(sig, frame)  # a second Ctrl-C: uvicorn's exit, without waiting for the drain

    def _start_drain(self, sig: int) -> None:
        log.info("%s: draining for up to %g s", signal.Signals(sig).name, self.grace_s)
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            log.info("drained: %s", await graceful_shutdown(self.engine, self.grace_s))
        except Exception:  # noqa: BLE001 - exit anyway
            log.exception("draining failed")
        finally:
            self.should_exit = True
