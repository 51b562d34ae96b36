"""Programs with PTX that builds only for ``sm_90a`` (Hopper's warp-group products,
``backends.cuda.wgmma``): OpenCL C cannot target ``sm_90a``, so the generated source writes those
instructions as PTX comments marked ``SM90A``; NVIDIA's OpenCL compiles the source to PTX (its
program binary is PTX text), and ``for_sm90a`` turns that PTX into the program meant: the marks
removed, the target ``sm_90a``, and the dynamic local memory a launched kernel names
(``backends.cuda.tma.DYNAMIC``) declared. ``clCreateProgramWithBinary`` then builds it."""

from __future__ import annotations

import re

from backends.cuda.tma import DYNAMIC
from backends.cuda.wgmma import SM90A

_TARGET = re.compile(rb"^(\s*\.target\s+)sm_90a?\b", re.MULTILINE)


def needs_sm90a(source: str) -> bool:
    """Whether a generated program carries ``sm_90a`` instructions."""
    return SM90A in source


def for_sm90a(binary: bytes) -> bytes:
    """The PTX program ``binary`` with its ``SM90A`` comments made instructions, for ``sm_90a``.
    A ``ValueError`` says why not: not PTX, or PTX for another target (the device is not sm_90)."""
    if b".version" not in binary[:4096] or not _TARGET.search(binary):
        head = binary[:200].decode("latin-1", "replace")
        raise ValueError(f"the program binary is not PTX for sm_90 (it begins {head!r})")
    if SM90A.encode() not in binary:
        raise ValueError("the PTX lost the sm_90a instructions (the compiler dropped its comments)")
    out = _TARGET.sub(rb"\1sm_90a", binary.replace(SM90A.encode(), b""))
    return declare_dynamic(out) if DYNAMIC.encode() in out else out


_ADDRESS_SIZE = re.compile(rb"^\s*\.address_size\s+\d+[ \t]*$", re.MULTILINE)


def declare_dynamic(ptx: bytes) -> bytes:
    """``ptx`` with the dynamic local memory of launched kernels (``tma.DYNAMIC``) declared after
    its header: 1024-aligned, as the 128-byte swizzle reads address bits."""
    m = _ADDRESS_SIZE.search(ptx)
    if m is None:
        raise ValueError("the PTX has no .address_size line")
    decl = f"\n.extern .shared .align 1024 .b8 {DYNAMIC}[];".encode()
    return ptx[: m.end()] + decl + ptx[m.end():]
