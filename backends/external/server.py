"""``serve``: any target (built in, a plugin's, ``interp``) as a tile-external backend on stdin/stdout.

This is the protocol's reference implementation (``python -m tile serve --target ID``) and what the
tests drive the client with. It announces version 2, stage ``tile``, the dtypes the target supports
and its declared ``capabilities`` (when its device declares any), then
answers run requests one at a time: it compiles each program text with ``tile.compile`` once (a
few dozen are kept), runs it on the request's inputs and sends the outputs back. A ``TileError``
becomes a ``refused`` reply (a ``TileBackendError`` a ``failed`` one) and any other exception a
``failed`` reply; the server goes on to the next request.

Only protocol messages go to stdout: the protocol keeps a private copy of file descriptor 1, and
descriptor 1 itself (``print``, ``TILE_DEBUG``, a compiler's chatter) is pointed at stderr.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import traceback

import numpy as np

from backends.external.protocol import (
    MAX_REQUEST_HEADER,
    PROTOCOL,
    VERSION,
    Channel,
    ProtocolError,
    StreamClosed,
    Timeout,
    decode_header,
    parse_specs,
    skippable_bytes,
    spec_of,
)
from tile.dtypes import DType
from tile.errors import TileBackendError, TileError

KEEP = 32  # compiled programs kept, by program text


class _Unreadable(Exception):
    """The request stream cannot be followed any more (exit status 2)."""


def hello(target: str) -> dict:
    """The handshake for ``target`` (a ``TileError`` if it names no usable device)."""
    declared = None
    if target == "interp":
        dtypes = list(DType)
        name = "the Tile reference interpreter"
    else:
        from backends import registry

        dev = registry.get(target)
        caps = dev.capabilities
        dtypes = [
            d
            for d in DType
            if caps.supports(d)
            and (d is not DType.FLOAT64 or caps.fp64)
            and (d is not DType.FLOAT16 or caps.fp16)
        ]
        name = f"{target}: {dev.description}"
        declared = getattr(caps, "declared", None)
    greeting = {
        "protocol": PROTOCOL,
        "version": VERSION,
        "name": name,
        "stage": "tile",
        "dtypes": [d.value for d in dtypes],
        "limits": {},
    }
    if declared is not None:  # (version 2: what the target declares)
        greeting["capabilities"] = declared.to_json()
    return greeting


def serve(target: str, timeout: float | None = None, stdin: int = 0, stdout: int = 1) -> int:
    """Serve ``target`` until EOF or a ``bye`` (0), ``timeout`` seconds without a request (0), or
    a stream that cannot be read on (2; also when ``target`` is unusable). ``stdin`` and
    ``stdout`` are the file descriptors of the protocol."""
    saved_stdout = sys.stdout
    channel_fd = os.dup(stdout)
    if stdout == 1:  # from here on, stray output to fd 1 goes to stderr, not into the protocol
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    try:
        try:
            greeting = hello(target)
        except TileError as e:
            print(f"tile serve: {e}", file=sys.stderr)
            return 2
        return _Server(target, Channel(stdin, channel_fd), timeout).run(greeting)
    finally:
        if stdout == 1:
            sys.stdout.flush()
            os.dup2(channel_fd, 1)
            sys.stdout = saved_stdout
        os.close(channel_fd)


class _Server:
    def __init__(self, target: str, channel: Channel, timeout: float | None):
        self.target = target
        self.channel = channel
        self.timeout = timeout
        self.programs: collections.OrderedDict[str, object] = collections.OrderedDict()

    def run(self, greeting: dict) -> int:
        try:
            self.channel.send(greeting)
            while True:
                if not self.step():
                    return 0
        except _Unreadable as e:
            print(f"tile serve: {e}; exiting", file=sys.stderr)
            return 2
        except StreamClosed as e:
            if e.partial:
                print(f"tile serve: the client {e}; exiting", file=sys.stderr)
                return 2
            return 0  # EOF between messages, or the client stopped reading our reply

    def deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def step(self) -> bool:
        """Answer one message; False when the conversation is over."""
        try:
            line = self.channel.read_line(self.deadline(), MAX_REQUEST_HEADER)
        except Timeout:
            if self.channel.buffered:
                raise _Unreadable(f"a request stalled for {self.timeout:g} s") from None
            print(f"tile serve: no request for {self.timeout:g} s; exiting", file=sys.stderr)
            return False
        except StreamClosed:
            if self.channel.buffered:
                raise
            return False
        except ProtocolError as e:  # a header line too long to find its end
            raise _Unreadable(f"the client {e}") from None
        try:
            header = decode_header(line)
        except ProtocolError as e:
            self.error(None, "protocol", "ProtocolError", f"the request {e}")
            return True
        rid = header.get("id")
        op = header.get("op")
        if op == "bye":
            return False
        if op != "run":
            self.error(
                rid, "protocol", "ProtocolError", f"unknown op {op!r}: this server knows 'run' and 'bye'"
            )
            return True
        try:
            specs = parse_specs(header.get("inputs"), "inputs")
            program = header.get("program")
            if not isinstance(program, str):
                raise ProtocolError(f"'program' is {type(program).__name__}, not a string")
            if not (isinstance(rid, int) and not isinstance(rid, bool)):
                raise ProtocolError(f"'id' is {rid!r}, not an integer")
            wanted = parse_specs(header.get("outputs", []), "outputs", with_bytes=False)
        except ProtocolError as e:
            skip = skippable_bytes(header.get("inputs"))
            self.error(rid, "protocol", "ProtocolError", f"bad run request: {e}")
            if skip is None:
                raise _Unreadable(f"a run request whose array bytes cannot be counted: {e}") from None
            self.channel.skip(skip, self.deadline())
            return True
        try:
            inputs = self.channel.read_arrays(specs, self.deadline())
        except Timeout:
            raise _Unreadable(f"the arrays of request {rid} stalled for {self.timeout:g} s") from None
        except StreamClosed:
            raise
        except ProtocolError as e:  # a bool array with other bytes: its bytes were all read
            self.error(rid, "protocol", "ProtocolError", f"bad run request: {e}")
            return True
        self.answer(rid, program, inputs, [w.name for w in wanted])
        return True

    def answer(self, rid: int, program: str, inputs: dict, wanted: list[str]) -> None:
        try:
            got = self.executable(program)(inputs)
            names = wanted if sorted(wanted) == sorted(got) else list(got)
            arrays = [np.asarray(got[n]) for n in names]
            specs = [spec_of(n, a) for n, a in zip(names, arrays)]
        except TileBackendError as e:
            self.error(rid, "failed", type(e).__name__, e.message, e)
            return
        except TileError as e:
            self.error(rid, "refused", type(e).__name__, e.message, e)
            return
        except Exception as e:  # noqa: BLE001 - a failing target is reported, the server goes on
            traceback.print_exc(file=sys.stderr)
            self.error(rid, "failed", type(e).__name__, str(e))
            return
        self.channel.send({"id": rid, "ok": True, "outputs": specs}, arrays)

    def executable(self, program: str):
        exe = self.programs.get(program)
        if exe is None:
            import tile

            exe = tile.compile(program, self.target)
            self.programs[program] = exe
            while len(self.programs) > KEEP:
                self.programs.popitem(last=False)
        self.programs.move_to_end(program)
        return exe

    def error(self, rid, kind: str, type_name: str, message: str, e: TileError | None = None) -> None:
        error: dict = {"kind": kind, "type": type_name, "message": message}
        if e is not None and e.span is not None:
            error["line"], error["col"] = e.span.line, e.span.col
        if e is not None and e.hint:
            error["hint"] = e.hint
        self.channel.send({"id": rid, "ok": False, "error": error})
