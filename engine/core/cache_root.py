"""Where kvloop keeps what it derives from a model and can rebuild at will (compiled artefacts, converted
weights): inside the virtual environment (they live and die with the torch that made them), else the user's
cache directory. Each cache has its own folder under it, which an environment variable
can move or turn off."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("kvloop.engine")


def cache_root() -> Path:
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "share" / "kvloop"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvloop"


def cache_dir_from(env: str, name: str) -> Path | None:
    """A cache's folder: $env when set, None when $env is "off" (or 0, none), else cache_root()/name."""
    chosen = os.environ.get(env, "")
    if chosen.lower() in ("off", "0", "none"):
        return None
    return Path(chosen) if chosen else cache_root() / name


def prune_unused(root: Path, pattern: str, days: int, what: str) -> None:
    """Removes the files under root matching pattern that nobody has read (or written) for `days`: a cache's
    entries for other models, formats or versions. Readers touch the files they use."""
    cutoff = time.time() - days * 86400
    for old in root.glob(pattern):
        try:
            if old.stat().st_mtime < cutoff:
                old.unlink()
                log.info("%s: removed %s (unused for %d days)", what, old, days)
        except OSError:
            pass  # another process removed or replaced it
