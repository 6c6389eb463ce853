"""Runs the sidecar: coordinator loop in a thread, HTTP app in uvicorn, annotation in a cluster."""

from __future__ import annotations

import logging
import threading

from kvloop.sidecar.annotation import AnnotationPublisher
from kvloop.sidecar.app import build_app
from kvloop.sidecar.coordinator import Coordinator
from kvloop.sidecar.settings import SettingsWatcher, parse_speculation_cap

log = logging.getLogger("kvloop.sidecar")


def run(config: str | None, control: str | None, host: str = "0.0.0.0", port: int = 9090,
        mode: str | None = None, period: float | None = None, law: str | None = None,
        speculation_cap: int | None = None) -> int:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides = {k: v for k, v in (("mode", mode), ("period_s", period), ("law_kind", law),
                                   ("speculation_cap", parse_speculation_cap(speculation_cap)))
                 if v is not None}
    watcher = SettingsWatcher(config, overrides)
    coord = Coordinator(watcher, control_path=control)
    s = watcher.settings
    publisher = AnnotationPublisher.from_env(s.annotation_key,
                                             s.heartbeat_s) if s.annotation_enabled else None

    def on_tick() -> None:
        if publisher is not None and coord.settings.annotation_enabled:
            publisher.maybe_publish(coord.annotation())

    stop = threading.Event()
    loop = threading.Thread(target=coord.run, args=(stop, on_tick), name="coordinator", daemon=True)
    loop.start()
    log.info("sidecar: mode=%s law=%s period=%ss control=%s annotation=%s", s.mode, s.law_kind, s.period_s,
             coord.control_path, "on" if publisher else "off")
    try:
        uvicorn.run(build_app(coord, alive=loop.is_alive), host=host, port=port, log_level="warning")
    finally:
        stop.set()
        loop.join(timeout=5)
        if publisher is not None:
            publisher.close()
    return 0
