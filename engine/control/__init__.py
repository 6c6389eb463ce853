"""Shared-memory control block between the engine and its sidecar (pure Python, no torch).

Layout in `layout`; the engine's end is `ControlLink`, the sidecar's `SidecarLink`."""

from kvloop.engine.control.block import DEFAULT_PATH, ControlBlock, ControlBlockError
from kvloop.engine.control.link import ControlLink, SidecarLink
from kvloop.engine.control.records import Targets

__all__ = ["DEFAULT_PATH", "ControlBlock", "ControlBlockError", "ControlLink", "SidecarLink", "Targets"]
