"""The system C compiler: finding it, and building generated sources into cached shared libraries.

A library is cached by a hash of everything that decides its bytes: the source (the runtime and
every kernel, which already reflect the program's shapes and dtypes), the compiler's path and
version, and the flags. It lives in ``$TILE_CACHE_DIR/c_cpu`` (else ``~/.cache/tile/c_cpu``), is
written under a temporary name and renamed into place (two processes building the same library
both succeed), and a cache directory that cannot be used means building in a temporary one.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from tile_c_backend.errors import CompileFailed

FORMAT = "1"  # bump when the way a library is built changes
# -fwrapv: signed integers wrap as Tile's do; -ffp-contract=off: no fused multiply-add, each
# operation rounds as in the interpreter; -fno-math-errno: math functions need not set errno
FLAGS = ("-O2", "-shared", "-fPIC", "-fwrapv", "-ffp-contract=off", "-fno-math-errno")
LIBS = ("-lm",)


def find_compiler() -> list[str] | None:
    """The C compiler command: ``$CC`` (which may carry arguments) if set, else ``cc``; None
    when it is not on the PATH."""
    words = shlex.split(os.environ.get("CC", "")) or ["cc"]
    path = shutil.which(words[0])
    return [path, *words[1:]] if path else None


@cache
def version(compiler: tuple[str, ...]) -> str:
    """The first line of ``compiler --version`` (part of every cache key)."""
    try:
        done = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "unknown"


@cache
def has_float16(compiler: tuple[str, ...]) -> bool:
    """Whether the compiler has ``_Float16`` (it predefines ``__FLT16_MAX__`` then: GCC 12+ and
    clang 15+ on x86-64 and AArch64); float16 is supported only then."""
    try:
        done = subprocess.run(
            [*compiler, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and "__FLT16_MAX__" in done.stdout


def cache_dir() -> Path:
    """``$TILE_CACHE_DIR/c_cpu`` if the variable is set, else ``~/.cache/tile/c_cpu``."""
    env = os.environ.get("TILE_CACHE_DIR")
    if env:
        return Path(env) / "c_cpu"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tile" / "c_cpu"


def cache_key(compiler: tuple[str, ...], source: str) -> str:
    h = hashlib.sha256()
    for part in (FORMAT, *compiler, version(compiler), *FLAGS, *LIBS, source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def build(compiler: tuple[str, ...], source: str, use_cache: bool = True) -> Path:
    """The shared library of ``source``: the cached one when there is one, else freshly built (and
    cached unless ``use_cache`` is False). Raises ``CompileFailed`` with the compiler's message."""
    key = cache_key(compiler, source)
    if use_cache:
        folder = _usable(cache_dir())
        if folder is not None:
            lib = folder / f"{key}.so"
            if lib.is_file():
                return lib
            return _compile(compiler, source, folder, lib)
    folder = Path(tempfile.mkdtemp(prefix="tile_c_"))
    return _compile(compiler, source, folder, folder / f"{key}.so")


def _usable(folder: Path) -> Path | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK) else None


def _compile(compiler: tuple[str, ...], source: str, folder: Path, lib: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{lib.stem}.", suffix=".c", dir=folder)
    out = tmp[:-2] + ".so"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [*compiler, *FLAGS, "-o", out, tmp, *LIBS]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            raise CompileFailed(f"c_cpu.0: could not run the C compiler ({shlex.join(cmd)}): {e}") from None
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            shown = "\n".join(lines[:20]) + (
                f"\n... ({len(lines) - 20} more lines)" if len(lines) > 20 else ""
            )
            raise CompileFailed(
                f"c_cpu.0: the C compiler failed ({shlex.join(cmd)}):\n{shown}",
                None,
                hint="a bug of the generator or of the toolchain (TILE_DEBUG=3 prints the source)",
            )
        os.replace(out, lib)  # atomic: readers see no library or a whole one
    finally:
        for leftover in (tmp, out):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
    return lib
