"""The tile-external protocol, version 2 (version 1 still accepted): framing and arrays, shared by
client and server. Version 2 adds the handshake's optional ``capabilities`` (a declaration:
``tile.capabilities.Declared``); a version 1 backend declares nothing beyond its dtypes.

A message is one line of UTF-8 JSON (the header, an object, ended by ``\\n``) followed by the raw
bytes of the arrays its header lists, in order: a run request's ``inputs`` and an ``ok`` reply's
``outputs``. Each array is described by ``{"name", "dtype", "shape", "nbytes"}`` and its bytes are
C-contiguous little-endian. docs/external_protocol.md is the full specification.

Every read and write here takes a deadline (``time.monotonic()`` seconds, None: no limit), so a
peer that stops talking is a ``Timeout``, not a hang. What the other side got wrong is a
``ProtocolError`` whose message says what, in words a backend author can act on.
"""

from __future__ import annotations

import io
import json
import math
import os
import select
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tile.dtypes import DType

PROTOCOL = "tile-external"
VERSION = 2  # what this Tile announces (``tile serve``)
VERSIONS = (1, 2)  # what it accepts from a backend
DTYPES = {d.value: d for d in DType}
MAX_REPLY_HEADER = 16 << 20  # bytes of a reply's header line before it counts as garbage
MAX_REQUEST_HEADER = 1 << 30  # a request carries the program text: be generous
_CHUNK = 1 << 16


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow (``str(e)`` says what)."""


class Timeout(ProtocolError):
    """The deadline passed before the peer finished (or started) a message."""


class StreamClosed(ProtocolError):
    """The peer closed its end: at a message boundary (``partial`` False) or inside a message."""

    def __init__(self, message: str, partial: bool):
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class Spec:
    """One array of a message, as its header describes it."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int


def spec_of(name: str, array: np.ndarray) -> dict:
    """The header entry describing ``array`` (which must have a Tile dtype)."""
    return {
        "name": name,
        "dtype": DType.of(array.dtype).value,
        "shape": [int(d) for d in array.shape],
        "nbytes": int(array.nbytes),
    }


def wire_bytes(array: np.ndarray) -> memoryview:
    """``array``'s bytes as they travel: C order, little-endian."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return memoryview(little.reshape(-1).view(np.uint8))


def excerpt(data: bytes | str, limit: int = 80) -> str:
    text = data if isinstance(data, str) else data.decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def decode_header(line: bytes) -> dict:
    """A header line (without its ``\\n``) as a JSON object, or a ``ProtocolError``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"sent a header that is not UTF-8: {excerpt(line)}") from None
    try:
        header = json.loads(text)
    except ValueError as e:
        raise ProtocolError(f"sent a header that is not JSON ({e}): {excerpt(text)}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"sent a header that is {type(header).__name__}, not an object: {excerpt(text)}")
    return header


def encode_header(header: Mapping) -> bytes:
    return json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


def is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_specs(value, where: str, with_bytes: bool = True) -> list[Spec]:
    """The array list ``where`` (e.g. ``"outputs"``) of a header, checked: a known dtype, a shape
    of non-negative ints, unique names and (``with_bytes``) ``nbytes`` equal to what the dtype and
    shape take. ``nbytes`` is 0 in the specs of a list without bytes."""
    if not isinstance(value, list):
        raise ProtocolError(f"'{where}' is {type(value).__name__}, not a list of arrays")
    specs, seen = [], set()
    for i, entry in enumerate(value):
        at = f"'{where}'[{i}]"
        if not isinstance(entry, dict):
            raise ProtocolError(f"{at} is {type(entry).__name__}, not an object")
        name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"{at} has no name (a non-empty string)")
        if name in seen:
            raise ProtocolError(f"{at} repeats the name '{name}'")
        seen.add(name)
        if dtype not in DTYPES:
            raise ProtocolError(
                f"{at} ('{name}') has the dtype {dtype!r}, which is none of {', '.join(DTYPES)}"
            )
        if not isinstance(shape, list) or not all(is_count(d) for d in shape):
            raise ProtocolError(f"{at} ('{name}') has the shape {shape!r}, not a list of non-negative ints")
        size = math.prod(shape) * DTYPES[dtype].numpy.itemsize
        nbytes = entry.get("nbytes")
        if with_bytes and nbytes != size:
            raise ProtocolError(
                f"{at} ('{name}') says nbytes {nbytes!r}, but {dtype}{shape} takes {size} bytes"
            )
        specs.append(Spec(name, DTYPES[dtype], tuple(shape), size if with_bytes else 0))
    return specs


def skippable_bytes(value) -> int | None:
    """The total ``nbytes`` of an array list that may be malformed otherwise (so a reader can skip
    past the bytes of a message it refuses), or None where that cannot be known."""
    if not isinstance(value, list):
        return None if value is not None else 0
    counts = [e.get("nbytes") if isinstance(e, dict) else None for e in value]
    return sum(counts) if all(is_count(n) for n in counts) else None


class Channel:
    """A message stream over a pair of file descriptors (the peer's stdout and stdin, or our own).

    The write descriptor should be non-blocking where writes have deadlines (a peer that stops
    reading would otherwise block a large write forever)."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._in: io.FileIO | None = None  # (made at the first array: either side may be unused)
        self._buf = bytearray()  # bytes read past the last message taken

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken (nonzero after a timeout: a message was started)."""
        return len(self._buf)

    def _wait(self, fd: int, deadline: float | None, writing: bool = False) -> None:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Timeout("the deadline passed")
            ready = select.select([], [fd], [], left) if writing else select.select([fd], [], [], left)
            if ready[1] if writing else ready[0]:
                return

    def _fill(self, deadline: float | None, mid_message: bool) -> None:
        self._wait(self.read_fd, deadline)
        chunk = os.read(self.read_fd, _CHUNK)
        if not chunk:
            partial = mid_message or bool(self._buf)
            raise StreamClosed(
                "closed its end " + ("inside a message" if partial else "of the stream"), partial
            )
        self._buf += chunk

    def read_line(self, deadline: float | None, limit: int) -> bytes:
        """The next header line, without its ``\\n`` (``limit``: its longest allowed length)."""
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[: end + 1]
                return line
            if len(self._buf) > limit:
                raise ProtocolError(
                    f"sent a header line longer than {limit} bytes: {excerpt(self._buf[:80])}"
                )
            start = len(self._buf)
            self._fill(deadline, mid_message=False)

    def read_exact(self, n: int, deadline: float | None) -> bytearray:
        """The next ``n`` bytes of the current message."""
        out = bytearray(n)
        have = min(n, len(self._buf))
        out[:have] = self._buf[:have]
        del self._buf[:have]
        view = memoryview(out)
        if have < n and self._in is None:
            self._in = io.FileIO(self.read_fd, "rb", closefd=False)
        while have < n:
            self._wait(self.read_fd, deadline)
            got = self._in.readinto(view[have:])
            if not got:
                raise StreamClosed(f"closed its end inside a message ({have} of {n} array bytes came)", True)
            have += got
        return out

    def skip(self, n: int, deadline: float | None) -> None:
        while n > 0:
            n -= len(self.read_exact(min(n, 1 << 24), deadline))

    def read_arrays(self, specs: Sequence[Spec], deadline: float | None) -> dict[str, np.ndarray]:
        """The arrays ``specs`` describe, read from the stream in order (writable, native order).
        All their bytes are read before any is checked, so a bad one leaves the stream in step."""
        raws = [self.read_exact(s.nbytes, deadline) for s in specs]
        arrays = {}
        for s, raw in zip(specs, raws):
            a = np.frombuffer(raw, dtype=s.dtype.numpy.newbyteorder("<")).reshape(s.shape)
            if s.dtype is DType.BOOL and a.size and raw.translate(None, b"\x00\x01"):
                raise ProtocolError(f"array '{s.name}' is bool and has bytes other than 0 and 1")
            arrays[s.name] = a if a.dtype.isnative else a.astype(s.dtype.numpy)
        return arrays

    def send(self, header: Mapping, arrays: Iterable[np.ndarray] = (), deadline: float | None = None) -> None:
        """Write one message: ``header`` (whose array list must describe ``arrays``), then their bytes."""
        self.write(encode_header(header), deadline)
        for a in arrays:
            self.write(wire_bytes(a), deadline)

    def write(self, data: bytes | memoryview, deadline: float | None) -> None:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                done += os.write(self.write_fd, view[done : done + (1 << 20)])
            except BlockingIOError:  # a non-blocking pipe that is full: wait until the peer reads
                self._wait(self.write_fd, deadline, writing=True)
            except (BrokenPipeError, ConnectionResetError):
                raise StreamClosed("stopped reading (its end of the pipe is closed)", done > 0) from None
