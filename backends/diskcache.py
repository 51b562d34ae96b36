"""What every backend's on-disk kernel cache shares: where entries live, how a key is made, and
atomic, failure-tolerant reads and writes (an unreadable or unwritable cache is simply a miss)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_dir(backend: str) -> Path:
    """``$TILE_CACHE_DIR`` if set, else ``~/.cache/tile/<backend>``."""
    env = os.environ.get("TILE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tile" / backend


def digest(meta: dict, text: str) -> str:
    """SHA-256 of the metadata (as sorted JSON) and the generated code."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode())
    h.update(b"\0")
    h.update(text.encode())
    return h.hexdigest()


def read_entry(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data or None


def write_entry(path: Path, data: bytes) -> bool:
    """Write through a temporary file renamed into place, so readers never see half an entry."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        return False
