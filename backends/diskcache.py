"""What every backend's on-disk kernel cache shares: where entries live, how a key is made, and
atomic, checked, failure-tolerant reads and writes.

* **Key.** ``digest`` hashes the backend's metadata (its format number, build settings, compiler
  and device identity) together with this package's version and the generated code. The generated
  code is the whole input of the compile step: it is produced from the optimized Stripe, so it
  already reflects the input shapes and dtypes and everything the optimizer config (its passes,
  their parameters, the device's hardware model) did to the program. A changed setting, config,
  shape or version gives a different key, never an old kernel. (The program cache,
  ``backends.progcache``, keys its entries earlier, from the bound program, and stores them here
  the same way.)
* **Entries.** Each file is a header (``MAGIC``, the key it was stored under, the payload's length
  and SHA-256) followed by the payload. ``read_entry`` returns the payload only when all of these
  match, so a truncated, corrupted, foreign or pre-header file is a miss: the kernel is rebuilt and
  the entry rewritten, never loaded.
* **Concurrency.** Writes go to a temporary file in the cache directory renamed into place, so
  readers (other threads or processes) see either no entry or a whole one; two builders of the same
  kernel both succeed and the last rename wins with an equally valid entry.
* **Faults.** A cache directory that cannot be created, read or written makes every lookup a miss
  and every store a no-op; the first such failure per directory issues one ``CacheWarning``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from importlib import metadata
from pathlib import Path

MAGIC = b"TILE-KC1"
_HEADER = len(MAGIC) + 64 + 8 + 32  # magic, hex key, payload length, payload SHA-256


class CacheWarning(UserWarning):
    """The kernel cache directory is unusable: programs still run, compiled every time."""


def _project_version() -> str:
    try:
        return metadata.version("tile")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


VERSION = _project_version()

_warned: set[str] = set()
_warned_lock = threading.Lock()


def cache_dir(backend: str) -> Path:
    """``$TILE_CACHE_DIR`` if set, else ``~/.cache/tile/<backend>``."""
    env = os.environ.get("TILE_CACHE_DIR")
    if env:
        return Path(env)
    try:
        return Path.home() / ".cache" / "tile" / backend
    except RuntimeError:  # no home directory: a cache that is never usable (one warning)
        return Path("/nonexistent-home/.cache/tile") / backend


def digest(meta: dict, text: str) -> str:
    """SHA-256 of the metadata plus ``{"tile": VERSION}`` (as sorted JSON), a NUL, and the code."""
    h = hashlib.sha256(json.dumps({**meta, "tile": VERSION}, sort_keys=True, default=str).encode())
    h.update(b"\0")
    h.update(text.encode())
    return h.hexdigest()


def _warn_once(directory: Path, what: str, err: OSError) -> None:
    key = str(directory)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    reason = err.strerror or type(err).__name__
    warnings.warn(
        f"the kernel cache directory {directory} cannot be {what} ({reason}); compiling without "
        "the disk cache (set TILE_CACHE_DIR to a writable directory, or pass cache=False / --no-cache)",
        CacheWarning,
        stacklevel=3,
    )


def pack(key: str, data: bytes) -> bytes:
    """An entry's bytes: the header for ``key`` and ``data``, then ``data``."""
    length = len(data).to_bytes(8, "little")
    return MAGIC + key.encode("ascii") + length + hashlib.sha256(data).digest() + data


def unpack(key: str, raw: bytes) -> bytes | None:
    """The payload of an entry stored under ``key``; None if the entry is not exactly that."""
    if len(raw) < _HEADER or not raw.startswith(MAGIC):
        return None
    at = len(MAGIC)
    if raw[at : at + 64] != key.encode("ascii"):
        return None
    length = int.from_bytes(raw[at + 64 : at + 72], "little")
    checksum = raw[at + 72 : _HEADER]
    data = raw[_HEADER:]
    if length != len(data) or not data or hashlib.sha256(data).digest() != checksum:
        return None
    return data


def read_entry(path: Path, key: str) -> bytes | None:
    """The checked payload at ``path`` (stored under ``key``), or None: missing, unreadable, bad."""
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no directory: the write says so)
        return None
    except OSError as e:
        _warn_once(path.parent, "read", e)
        return None
    return unpack(key, raw)


def write_entry(path: Path, key: str, data: bytes) -> bool:
    """Write through a temporary file renamed into place, so readers never see half an entry."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(pack(key, data))
        os.replace(tmp, path)
        return True
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        _warn_once(path.parent, "written", e)
        return False
