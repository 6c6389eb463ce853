"""Where kvloop keeps what it derives from a model and can rebuild at will (compiled artefacts, converted
weights): inside the virtual environment (they live and die with the torch that made them), else the user's
cache directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_root() -> Path:
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "share" / "kvloop"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvloop"
