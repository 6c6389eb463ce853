"""The host's memory as the kernel reports it (pure Python): what start-up choices that cost memory read."""

from __future__ import annotations

from pathlib import Path


def meminfo_available_bytes(meminfo: str) -> int | None:
    """MemAvailable of a /proc/meminfo text, in bytes (None when absent)."""
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = value.split()
            return int(parts[0]) * 1024 if parts and parts[0].isdigit() else None
    return None


def available_bytes() -> int | None:
    """Memory the host can give without swapping (MemAvailable), or None where /proc/meminfo is unreadable."""
    try:
        return meminfo_available_bytes(Path("/proc/meminfo").read_text())
    except OSError:
        return None
