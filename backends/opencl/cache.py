"""A disk cache of OpenCL program binaries, so a program built before loads without compiling.

Entries live in ``$TILE_CACHE_DIR`` (else ``~/.cache/tile/opencl``), one ``<key>.clbin`` per
program. The key is the SHA-256 of everything that decides the binary: the OpenCL C source, the
build options and settings, and the device's name, vendor, version and driver version (plus a
format number bumped when the backend's conventions change). Writes go to a temporary file renamed
into place, so concurrent builders never see half an entry; an unreadable or unwritable cache, or a
binary the driver refuses, is simply a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

FORMAT = 1


def cache_dir() -> Path:
    env = os.environ.get("TILE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tile" / "opencl"


def cache_key(source: str, options: str, settings: dict, device: dict) -> str:
    meta = {
        "format": FORMAT,
        "options": options,
        "settings": {k: v for k, v in settings.items() if k not in ("cache", "async")},
        "device": device,
    }
    h = hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode())
    h.update(b"\0")
    h.update(source.encode())
    return h.hexdigest()


class BinaryCache:
    """One program's entry; ``enabled=False`` makes every lookup a miss and stores nothing."""

    def __init__(self, key: str, enabled: bool = True):
        self.key = key
        self.enabled = enabled
        self.path = cache_dir() / f"{key}.clbin"

    def load(self) -> bytes | None:
        if not self.enabled:
            return None
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        return data or None

    def store(self, data: bytes) -> bool:
        if not self.enabled or not data:
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".clbin")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
            return True
        except OSError:
            return False
