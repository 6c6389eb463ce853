"""Init-container helper: download a model file to the pod's model volume (http, https or file URIs).

    python -m kvloop.operator.fetch --uri https://host/model.gguf --dest /models/model.gguf [--sha256 HEX]

Skips the download when the destination exists (and matches the checksum when one is given).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import urllib.request


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(uri: str, dest: str, sha256: str | None = None, timeout: float = 60.0) -> bool:
    """Returns True when a download happened, False when the file was already there."""
    if os.path.exists(dest) and (not sha256 or sha256_of(dest) == sha256):
        return False
    if not uri.startswith(("http://", "https://", "file://")):
        raise ValueError(f"unsupported model URI scheme: {uri}")
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = dest + ".partial"
    with urllib.request.urlopen(uri, timeout=timeout) as rsp, open(tmp, "wb") as out:  # noqa: S310
        shutil.copyfileobj(rsp, out, 1 << 20)
    if sha256 and sha256_of(tmp) != sha256:
        os.unlink(tmp)
        raise ValueError(f"checksum mismatch for {uri}")
    os.replace(tmp, dest)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvloop.operator.fetch")
    p.add_argument("--uri", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--sha256")
    a = p.parse_args(argv)
    done = fetch(a.uri, a.dest, a.sha256)
    print(("downloaded " if done else "already present: ") + a.dest, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
