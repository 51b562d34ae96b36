"""A disk cache of compiled object code, so a program built before loads without running LLVM.

Entries live in ``$TILE_CACHE_DIR`` (else ``~/.cache/tile/llvm``), one ``<key>.o`` per module
(and one for the thread pool's runtime, ``runtime_key``: its IR text, host and LLVM).
The key (``plan_key``) is the SHA-256 of everything that decides the machine code, known before
any IR is generated: each codegen unit's canonical Stripe with its dtypes (``dedup.unit_key``:
the input shapes and whatever the optimizer config did are in it; names are not), which kernel
shares which function, what else the code generator is given (threads, vector and cache sizes,
target triple and layout), the build settings (all but ``cache``), the llvmlite and LLVM
versions, the host CPU's name and feature string, the project version, a hash of the sources that
generate the IR (``code_identity``) and a format number. A hit therefore skips IR generation,
parsing and optimization: the entry holds the object code, each kernel's stack bytes and the IR
text (for ``Library.source``), and the object is added to an empty MCJIT module. On a miss
MCJIT's ``notify`` hook stores the freshly compiled object. Entries carry a checksummed header and
are written through a temporary file renamed into place (``backends.diskcache``): a truncated or
corrupted entry is rebuilt, never loaded; concurrent builders never see half an entry; an unusable
cache directory is a miss (with one ``CacheWarning``).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from backends import diskcache

FORMAT = 3  # 2: entries carry diskcache's checked header; 3: keyed by the kernel plan (``plan_key``)
_ROOT = Path(__file__).resolve().parent.parent.parent
# what turns a plan into IR: this package, the HAL, the Stripe analyses it reads (not the passes:
# their output, the optimized Stripe, is in the key), dtypes and affine arithmetic
_SOURCES = sorted(
    [*Path(__file__).parent.glob("*.py"), _ROOT / "backends" / "hal.py", *(_ROOT / "stripe").glob("*.py")]
    + [_ROOT / "tile" / "dtypes.py", _ROOT / "tile" / "affine.py"]
)
_code_identity: str | None = None


def code_identity() -> str:
    """SHA-256 of the source files that turn a plan into LLVM IR (``_SOURCES``): a plan key must
    change when they do, even without a version bump (a checkout being edited). A file that cannot
    be read counts as its name alone."""
    global _code_identity
    if _code_identity is None:
        h = hashlib.sha256()
        for f in _SOURCES:
            try:
                data = f.read_bytes()
            except OSError:
                data = b""
            h.update(str(f.relative_to(_ROOT)).encode() + b"\0" + data)
        _code_identity = h.hexdigest()
    return _code_identity


def cache_dir() -> Path:
    return diskcache.cache_dir("llvm")


def plan_key(
    unit_keys: list[str], built: list[int], meta: dict, settings: dict, cpu: str, features: str
) -> str:
    """The key of a program's module from its plan, before any IR is generated: every unit's
    canonical Stripe and dtypes (``dedup.unit_key``, in order), which kernel calls which function,
    what the code generator was given besides (``meta``: threads, vector and cache sizes, target
    triple and layout, half-precision support), the settings, the host and this code's identity."""
    info = {
        "format": FORMAT,
        "settings": {k: v for k, v in settings.items() if k != "cache"},
        "llvmlite": llvmlite.__version__,
        "llvm": list(llvm.llvm_version_info),
        "cpu": cpu,
        "features": features,
        "code": code_identity(),
        "built": built,
        **meta,
    }
    return diskcache.digest(info, "\n\0".join(unit_keys))


def runtime_key(text: str, cpu: str, features: str) -> str:
    """The key of a runtime module's object (the thread pool's, ``threads``): its IR text, the host
    and LLVM, which are all its machine code depends on."""
    info = {"format": f"runtime-{FORMAT}", "llvmlite": llvmlite.__version__,
            "llvm": list(llvm.llvm_version_info), "cpu": cpu, "features": features}
    return diskcache.digest(info, text)


def pack_entry(stack: list[int], source: str, obj: bytes) -> bytes:
    """An entry's payload: each kernel's stack bytes, the IR text (compressed: ``TILE_DEBUG=3``
    and ``Library.source`` show it on a hit too) and the object code."""
    text = zlib.compress(source.encode(), 1)
    head = json.dumps({"stack": stack, "source": len(text)}).encode()
    return head + b"\n" + text + obj


def unpack_entry(data: bytes) -> tuple[list[int], str, bytes] | None:
    """``pack_entry``'s parts, or None for a payload of another shape (then rebuilt)."""
    try:
        end = data.index(b"\n")
        head = json.loads(data[:end])
        n = int(head["source"])
        source = zlib.decompress(data[end + 1 : end + 1 + n]).decode()
        return [int(b) for b in head["stack"]], source, data[end + 1 + n :]
    except (ValueError, KeyError, TypeError, zlib.error):
        return None


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
