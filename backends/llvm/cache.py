"""A disk cache of compiled object code, so a program built before loads without running LLVM.

Entries live in ``$TILE_CACHE_DIR`` (else ``~/.cache/tile/llvm``), one ``<key>.o`` per module.
The key is the SHA-256 of everything that decides the machine code: the generated (unoptimized)
IR text, the build settings (all but ``cache``), the llvmlite and LLVM versions, the host CPU's
name and feature string, the project version and a format number bumped when the backend's
conventions change. The IR text is generated from the optimized Stripe, so it carries the input
shapes and dtypes and whatever the optimizer config did (``backends.diskcache`` says more).
MCJIT's object cache hooks do the work: ``getbuffer`` hands it a stored object instead of
compiling, ``notify`` stores a freshly compiled one. Entries carry a checksummed header and are
written through a temporary file renamed into place (``backends.diskcache``): a truncated or
corrupted entry is rebuilt, never loaded; concurrent builders never see half an entry; an unusable
cache directory is a miss (with one ``CacheWarning``).
"""

from __future__ import annotations

from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from backends import diskcache

FORMAT = 2  # 2: entries carry diskcache's checked header


def cache_dir() -> Path:
    return diskcache.cache_dir("llvm")


def cache_key(ir_text: str, settings: dict, cpu: str, features: str) -> str:
    meta = {
        "format": FORMAT,
        "settings": {k: v for k, v in settings.items() if k != "cache"},
        "llvmlite": llvmlite.__version__,
        "llvm": list(llvm.llvm_version_info),
        "cpu": cpu,
        "features": features,
    }
    return diskcache.digest(meta, ir_text)


class ObjectCache:
    """One module's entry; ``enabled=False`` makes every lookup a miss and stores nothing."""

    def __init__(self, key: str, enabled: bool = True):
        self.key = key
        self.enabled = enabled
        self.path = cache_dir() / f"{key}.o"
        self.hit = False
        self.stored = False

    def load(self) -> bytes | None:
        if not self.enabled:
            return None
        data = diskcache.read_entry(self.path, self.key)
        self.hit = data is not None
        return data

    def store(self, data: bytes) -> None:
        if not self.enabled or self.hit:
            return
        self.stored = diskcache.write_entry(self.path, self.key, data)
