"""The control block file: create or open it, mmap it, read and write seqlocked records.

Pure Python (mmap, struct, zlib); no torch, so the sidecar can import it cheaply."""

from __future__ import annotations

import mmap
import os
import tempfile
import zlib
from pathlib import Path

from kvloop.engine.control import layout as L

DEFAULT_PATH = "/dev/shm/kvloop-control.bin"
READ_RETRIES = 8


class ControlBlockError(RuntimeError):
    """The file is missing or is not a control block of this layout version."""


class ControlBlock:
    """One mmap of the control file. `create=True` makes (or repairs) the file; else it must exist."""

    def __init__(self, path: str | os.PathLike, create: bool = False):
        self.path = Path(path)
        if create:
            _ensure_file(self.path)
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError as exc:
            raise ControlBlockError(f"no control block at {self.path}") from exc
        try:
            st = os.fstat(fd)
            if st.st_size < L.FILE_SIZE:
                raise ControlBlockError(f"{self.path} is {st.st_size} bytes, not a control block")
            self.inode = (st.st_dev, st.st_ino)
            self.mm = mmap.mmap(fd, L.FILE_SIZE)
        finally:
            os.close(fd)
        problem = header_problem(self.mm[: L.HEADER_SIZE])
        if problem:
            self.mm.close()
            raise ControlBlockError(f"{self.path}: {problem}")

    def close(self) -> None:
        self.mm.close()

    def replaced(self) -> bool:
        """True when the path now names another file (recreated by a restarted engine) or none."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self.inode

    # ---- records --------------------------------------------------------------------------------
    def write(self, offset: int, payload: bytes) -> None:
        mm = self.mm
        seq = L.RECORD_HEAD.unpack_from(mm, offset)[0]
        odd = seq + 1 if seq % 2 == 0 else seq + 2  # an odd seq left by a crashed writer: move past it
        L.RECORD_HEAD.pack_into(mm, offset, odd, 0, 0)
        start = offset + L.RECORD_HEAD.size
        mm[start : start + len(payload)] = payload
        L.RECORD_HEAD.pack_into(mm, offset, odd, zlib.crc32(payload), len(payload))
        L.RECORD_HEAD.pack_into(mm, offset, odd + 1, zlib.crc32(payload), len(payload))

    def read(self, offset: int, size: int) -> tuple[int, bytes | None]:
        """(seq, payload) of a record. payload b"": never written; None: garbled (bad crc or length),
        or, when seq is odd, a writer stayed inside the record through every retry (busy, try later)."""
        mm = self.mm
        seq1 = 1
        for _ in range(READ_RETRIES):
            seq1 = L.RECORD_HEAD.unpack_from(mm, offset)[0]
            if seq1 % 2:
                continue
            raw = mm[offset : offset + L.RECORD_HEAD.size + size]
            if L.RECORD_HEAD.unpack_from(mm, offset)[0] != seq1:
                continue
            _, crc, length = L.RECORD_HEAD.unpack_from(raw, 0)
            if seq1 == 0 and crc == 0 and length == 0:
                return 0, b""
            payload = raw[L.RECORD_HEAD.size : L.RECORD_HEAD.size + length]
            if length != size or zlib.crc32(payload) != crc:
                return seq1, None
            return seq1, payload
        return seq1 | 1, None

    def seq(self, offset: int) -> int:
        return L.RECORD_HEAD.unpack_from(self.mm, offset)[0]


def header_problem(head: bytes) -> str | None:
    """Why these header bytes are not a block this code can read (None: they are)."""
    magic, version, *_ = L.HEADER_FMT.unpack_from(head, 0)
    if magic != L.MAGIC:
        return "not a kvloop control block (bad magic)"
    if version != L.LAYOUT_VERSION:
        return (f"control block layout version {version}, but this kvloop reads version {L.LAYOUT_VERSION}: "
                f"run the engine and the sidecar from kvloop releases with the same layout")
    return None


def _ensure_file(path: Path) -> None:
    """Creates the file atomically (temp file + rename) unless a valid one is already there."""
    try:
        data = path.read_bytes()[: L.FILE_SIZE]
        if len(data) == L.FILE_SIZE and header_problem(data) is None:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".control-", dir=path.parent)
    try:
        os.write(fd, L.header_bytes().ljust(L.FILE_SIZE, b"\0"))
        os.fchmod(fd, 0o660)
    finally:
        os.close(fd)
    os.replace(tmp, path)
