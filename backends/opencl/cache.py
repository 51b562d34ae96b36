"""A disk cache of OpenCL program binaries, so a program built before loads without compiling.

Entries live in ``$TILE_CACHE_DIR`` (else ``~/.cache/tile/opencl``), one ``<key>.clbin`` per
program. The key is the SHA-256 of everything that decides the binary: the OpenCL C source, the
build options and settings (all but ``cache`` and ``async``), the device's name, vendor, version
and driver version, the project version and a format number bumped when the backend's conventions
change. The source is generated from the optimized Stripe, so it carries the input shapes and
dtypes and whatever the optimizer config did (``backends.diskcache`` says more). Entries carry a
checksummed header and are written through a temporary file renamed into place: a truncated or
corrupted entry is rebuilt, never loaded; concurrent builders never see half an entry; an unusable
cache directory, or a binary the driver refuses, is a miss (the directory with one
``CacheWarning``).
"""

from __future__ import annotations

from pathlib import Path

from backends import diskcache

FORMAT = 2  # 2: entries carry diskcache's checked header


def cache_dir() -> Path:
    return diskcache.cache_dir("opencl")


def cache_key(source: str, options: str, settings: dict, device: dict) -> str:
    meta = {
        "format": FORMAT,
        "options": options,
        "settings": {k: v for k, v in settings.items() if k not in ("cache", "async", "matrix_units")},
        "device": device,
    }
    return diskcache.digest(meta, source)


class BinaryCache:
    """One program's entry; ``enabled=False`` makes every lookup a miss and stores nothing."""

    def __init__(self, key: str, enabled: bool = True):
        self.key = key
        self.enabled = enabled
        self.path = cache_dir() / f"{key}.clbin"

    def load(self) -> bytes | None:
        if not self.enabled:
            return None
        return diskcache.read_entry(self.path, self.key)

    def store(self, data: bytes) -> bool:
        if not self.enabled or not data:
            return False
        return diskcache.write_entry(self.path, self.key, data)
