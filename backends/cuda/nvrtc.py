"""CUDA C++ to PTX: NVRTC through NVIDIA's bindings (``cuda.bindings.nvrtc``), with a disk cache.

Where NVRTC cannot be loaded but the CUDA toolkit's ``nvcc`` is on the path (a development machine
without a GPU), ``nvcc -ptx`` compiles the same source with the same options, so the dialect can
be checked there; ``compiler()`` says which one is used. Options: the device's virtual architecture
(``compute_90`` for an H100), ``--fmad=false`` (no contraction of a separately rounded multiply and
add, as OpenCL's ``FP_CONTRACT OFF``), C++17. A program that does not compile raises
``NvrtcError`` with the compiler's log.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from backends import diskcache

FORMAT = 1


class NvrtcError(RuntimeError):
    """The generated CUDA source did not compile (the message holds the compiler's log)."""


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    try:
        err, *_ = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001 - the bindings are there, the NVRTC library is not
        return None
    return nvrtc if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def compiler() -> str | None:
    """``"nvrtc"``, ``"nvcc"`` or None: what compiles CUDA source on this machine."""
    if _nvrtc() is not None:
        return "nvrtc"
    return "nvcc" if shutil.which("nvcc") else None


def options(capability: tuple[int, int]) -> list[str]:
    return [f"--gpu-architecture=compute_{capability[0]}{capability[1]}", "--fmad=false", "-std=c++17"]


def _path(key: str) -> Path:
    return diskcache.cache_dir("cuda") / f"{key}.ptx"


def cached(key: str) -> bytes | None:
    """The PTX the disk cache holds under ``key`` (``compile_ptx``'s third value), or None."""
    return diskcache.read_entry(_path(key), key)


def compile_ptx(source: str, capability: tuple[int, int], cache: bool = True) -> tuple[bytes, str, str]:
    """``source`` compiled to PTX for ``capability``, whether the cache had it (hit/miss/off), and
    its cache key."""
    opts = options(capability)
    key = diskcache.digest({"format": FORMAT, "options": opts}, source)
    path = _path(key)
    if cache:
        got = diskcache.read_entry(path, key)
        if got is not None:
            return got, "hit", key
    nvrtc = _nvrtc()
    if nvrtc is not None:
        ptx = _with_nvrtc(nvrtc, source, opts)
    elif shutil.which("nvcc"):
        ptx = _with_nvcc(source, opts)
    else:
        raise NvrtcError("no CUDA compiler: neither NVRTC (cuda-bindings and libnvrtc) nor nvcc is available")
    if cache:
        diskcache.write_entry(path, key, ptx)
    return ptx, "miss" if cache else "off", key


def _with_nvrtc(nvrtc, source: str, opts: list[str]) -> bytes:
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"tile.cu", 0, [], [])
    if err != ok:
        raise NvrtcError(f"nvrtcCreateProgram failed: {err}")
    try:
        flags = [o.encode() for o in (*opts, "--device-as-default-execution-space")]
        err, = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        if err != ok:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            text = _tail(log.decode(errors="replace"))
            raise NvrtcError(f"NVRTC could not compile the generated CUDA source:\n{text}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _with_nvcc(source: str, opts: list[str]) -> bytes:
    arch = opts[0].split("=")[1]
    with tempfile.TemporaryDirectory(prefix="tile-nvcc-") as d:
        src, out = Path(d) / "tile.cu", Path(d) / "tile.ptx"
        src.write_text(source)
        cmd = ["nvcc", "-ptx", f"-arch={arch}", *opts[1:], "-o", str(out), str(src)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if run.returncode != 0:
            raise NvrtcError(f"nvcc could not compile the generated CUDA source:\n{_tail(run.stderr)}")
        return out.read_bytes()


def _tail(log: str, lines: int = 40) -> str:
    got = log.strip().splitlines()
    more = f"... ({len(got) - lines} lines before)\n" if len(got) > lines else ""
    return more + "\n".join(got[-lines:]) + "\n(TILE_DEBUG=3 prints the source)"


__all__ = ["NvrtcError", "cached", "compile_ptx", "compiler", "options"]
