"""``ExternalDevice``: a whole-program target in another process, over the tile-external protocol.

The target id ``external:COMMAND`` starts COMMAND (split like a shell would, but run without one)
with pipes for stdin, stdout and stderr, reads its handshake, and sends it one run request per
call (docs/external_protocol.md). The backend may be written in any language.

A backend is someone else's program, so nothing it does may hang or crash the caller: every read
and write has a deadline, every reply is checked before it is believed, and anything off
(a crash, a hang, garbage, another request's id, outputs of the wrong name, shape or dtype) is a
``TileBackendError`` that names the target and ends with the tail of its stderr. The process is
then killed; the next call starts a fresh one. Its stderr is drained all the time into a bounded
buffer, so a chatty backend never blocks on a full pipe.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shlex
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping

import numpy as np

import tile.errors
from backends.external.protocol import (
    DTYPES,
    MAX_REPLY_HEADER,
    PROTOCOL,
    VERSIONS,
    Channel,
    ProtocolError,
    StreamClosed,
    Timeout,
    decode_header,
    is_count,
    parse_specs,
    spec_of,
)
from backends.hal import STAGES, Capabilities, ProgramDevice
from tile.capabilities import Declared
from tile.dtypes import DType
from tile.errors import Source, Span, TileBackendError, TileDeviceError, TileError, TileResourceError

DEFAULT_TIMEOUT = 60.0  # seconds a request may take; TILE_EXTERNAL_TIMEOUT overrides it
HELLO_REQUIRED = ("protocol", "version", "name", "stage", "dtypes")  # docs/external_protocol.md
START_TIMEOUT = 30.0  # the handshake gets at least this long (a backend may load a compiler first)
STDERR_TAIL = 4096  # bytes of the backend's stderr kept for error messages


def _json(value, limit: int = 80) -> str:
    """A value from a backend's message, shown as JSON and cut short."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _versions() -> str:
    return " and ".join(str(v) for v in VERSIONS)


def env_timeout() -> float:
    """``TILE_EXTERNAL_TIMEOUT`` (seconds), or the default."""
    text = os.environ.get("TILE_EXTERNAL_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise TileDeviceError(
            f"TILE_EXTERNAL_TIMEOUT is '{text}', not a positive number of seconds",
            None,
            hint=f"unset it for the default of {DEFAULT_TIMEOUT:g} s, or give e.g. 120",
        )
    return value


class _StderrTail:
    """Reads a process's stderr to its end on a thread, keeping the last ``STDERR_TAIL`` bytes."""

    def __init__(self, stream):
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self._thread.start()

    def _drain(self, stream) -> None:
        try:
            while chunk := os.read(stream.fileno(), 1 << 14):
                with self._lock:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size - len(self._chunks[0]) >= STDERR_TAIL:
                        self._size -= len(self._chunks.popleft())
        except OSError:
            pass
        finally:
            stream.close()

    def text(self, wait: float = 0.0) -> str:
        """The tail so far (``wait``: seconds to let the drain reach the end of the stream)."""
        self._thread.join(wait)
        with self._lock:
            data = b"".join(self._chunks)[-STDERR_TAIL:]
        return data.decode("utf-8", "replace")


class _Process:
    """One started backend: the child, its channel, its stderr tail and its handshake."""

    def __init__(self, argv: list[str]):
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # its own process group: killing it kills what it started
        )
        os.set_blocking(self.popen.stdin.fileno(), False)
        self.stderr = _StderrTail(self.popen.stderr)
        self.channel = Channel(self.popen.stdout.fileno(), self.popen.stdin.fileno())
        self.hello: dict = {}
        self.declared: Declared | None = None  # version 2's "capabilities"
        self.finalizer = weakref.finalize(self, _stop, self.popen)

    def status(self, wait: float = 0.0) -> str | None:
        """How it ended ("exited with status 3", "was killed by signal 9 (SIGKILL)"), or None."""
        try:
            code = self.popen.wait(wait) if wait else self.popen.poll()
        except subprocess.TimeoutExpired:
            return None
        if code is None:
            return None
        if code < 0:
            try:
                return f"was killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"


def _stop(popen: subprocess.Popen, grace: float = 0.0) -> None:
    """End a backend: EOF on its stdin, ``grace`` seconds to leave, then SIGKILL to its group."""
    try:
        popen.stdin.close()
    except OSError:
        pass
    try:
        popen.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except OSError:  # already gone (or its group is): the process itself is ours to kill
        popen.kill()
    popen.wait()


class ExternalDevice(ProgramDevice):
    """The backend ``COMMAND`` of the target id ``external:COMMAND`` (see the module docstring).

    ``timeout``: seconds one request may take (default ``TILE_EXTERNAL_TIMEOUT`` or 60);
    ``start_timeout``: seconds the handshake may take (default the larger of ``timeout`` and 30).
    The process starts on first use, including a first look at ``stage`` or ``capabilities``."""

    def __init__(
        self,
        command: str,
        device_id: str | None = None,
        timeout: float | None = None,
        start_timeout: float | None = None,
    ):
        self.command = command
        self.id = device_id or f"external:{command}"
        try:
            self.argv = shlex.split(command)
        except ValueError as e:
            raise TileDeviceError(f"cannot split the command of {self.id}: {e}", None) from None
        if not self.argv:
            raise TileDeviceError(f"{self.id} names no command", None, hint="write external:COMMAND")
        self.timeout = float(timeout) if timeout is not None else env_timeout()
        self.start_timeout = (
            float(start_timeout) if start_timeout is not None else max(self.timeout, START_TIMEOUT)
        )
        self.starts = 0  # processes started so far (a restart after a failure counts)
        self._proc: _Process | None = None
        self._first: dict | None = None  # the first handshake: a restart must agree with it
        self._next_id = 1
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ what the handshake says

    @property
    def stage(self) -> str:  # type: ignore[override]
        return self._hello()["stage"]

    @property
    def config(self) -> str:  # type: ignore[override]
        return self._hello().get("config") or ""

    @property
    def description(self) -> str:  # type: ignore[override]
        hello = self._hello()
        return f"{hello['name']}, in another process over {PROTOCOL} v{hello['version']} ({self.command})"

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        with self._lock:
            proc = self._process()
        dtypes = frozenset(DTYPES[d] for d in proc.hello["dtypes"])
        fp = dict(fp64=DType.FLOAT64 in dtypes, fp16=DType.FLOAT16 in dtypes)
        return Capabilities(dtypes, **fp, declared=proc.declared)

    @property
    def limits(self) -> dict:
        return dict(self._hello().get("limits") or {})

    def _hello(self) -> dict:
        with self._lock:
            return self._process().hello

    # ------------------------------------------------------------------ the process

    def _process(self) -> _Process:
        """The running backend, started (and its handshake read) if there is none."""
        if self._proc is not None and self._proc.popen.poll() is None:
            return self._proc
        if self._proc is not None:  # it left between calls: start afresh, report nothing
            self._discard()
        try:
            proc = _Process(self.argv)
        except OSError as e:
            raise TileBackendError(f"{self.id} could not start '{self.argv[0]}': {e.strerror or e}") from None
        self._proc = proc
        self.starts += 1
        try:
            line = proc.channel.read_line(time.monotonic() + self.start_timeout, MAX_REPLY_HEADER)
            proc.hello = self._check_hello(decode_header(line))
            caps = proc.hello.get("capabilities") if proc.hello["version"] >= 2 else None
            proc.declared = Declared.from_json(caps) if caps is not None else None
        except Timeout:
            self._fail(f"sent no handshake within {self.start_timeout:g} s")
        except StreamClosed:
            self._fail("ended before its handshake")
        except ProtocolError as e:
            self._fail(f"broke the protocol in its handshake: it {e}")
        return proc

    def _check_hello(self, hello: dict) -> dict:
        if hello.get("protocol") != PROTOCOL:
            raise ProtocolError(f"sent a first line that is not a {PROTOCOL} handshake: {_json(hello)}")
        for field in HELLO_REQUIRED:
            if field not in hello:
                raise ProtocolError(
                    f"sent a handshake without the required field '{field}' (a {PROTOCOL} handshake has "
                    f"{', '.join(HELLO_REQUIRED)}; this Tile speaks versions {_versions()}): {_json(hello)}"
                )
        version = hello["version"]
        if not is_count(version):
            raise ProtocolError(
                f"announced the version {_json(version)}, not a whole number "
                f"(this Tile speaks versions {_versions()})"
            )
        if version not in VERSIONS:
            raise ProtocolError(
                f"speaks {PROTOCOL} version {version!r}; this Tile speaks versions {_versions()}"
            )
        name, stage, config = hello.get("name"), hello.get("stage"), hello.get("config", "")
        dtypes, limits = hello.get("dtypes"), hello.get("limits", {})
        if not isinstance(name, str) or not name:
            raise ProtocolError("sent a handshake without a name (a non-empty string)")
        if stage not in STAGES:
            raise ProtocolError(f"announced the stage {stage!r}, which is none of {', '.join(STAGES)}")
        if not isinstance(config, str):
            raise ProtocolError(f"announced the config {config!r}, not a string")
        if not isinstance(dtypes, list) or not dtypes or not all(d in DTYPES for d in dtypes):
            raise ProtocolError(
                f"announced the dtypes {_json(dtypes)}: a non-empty list of {', '.join(DTYPES)} is needed"
            )
        if not isinstance(limits, dict):
            raise ProtocolError(f"announced the limits {_json(limits)}, not an object")
        max_bytes = limits.get("max_bytes")
        if max_bytes is not None and not (is_count(max_bytes) and max_bytes > 0):
            raise ProtocolError(f"announced the limit max_bytes {max_bytes!r}, not a positive int")
        if version >= 2 and hello.get("capabilities") is not None:  # (version 1: an unknown field)
            try:
                Declared.from_json(hello["capabilities"])
            except (ValueError, TypeError) as e:
                raise ProtocolError(f"announced capabilities that are wrong: 'capabilities' {e}") from None
        if self._first is None:
            self._first = hello
        elif (stage, config) != (self._first["stage"], self._first.get("config", "")):
            raise ProtocolError(
                f"announced stage {stage!r} (config {config!r}) after a restart, having first announced "
                f"{self._first['stage']!r} (config {self._first.get('config', '')!r})"
            )
        return hello

    def _discard(self) -> None:
        """Kill the current process (if any) and forget it: the next call starts another."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.finalizer.detach()
            _stop(proc.popen)

    def _fail(self, problem: str):
        """Kill the backend and raise a ``TileBackendError`` saying ``problem``, how the process
        ended (when it had) and the tail of its stderr."""
        proc = self._proc
        assert proc is not None
        ended = proc.status(wait=0.5)  # a crash: let it finish dying, to report how
        self._discard()
        tail = proc.stderr.text(wait=1.0).rstrip()
        message = f"{self.id} {problem}" + (f" (the process {ended})" if ended else "")
        if tail:
            shown = "\n".join("    " + line for line in tail.splitlines()[-20:])
            message += f"\nits stderr ends with:\n{shown}"
        raise TileBackendError(message, None, hint="the next call starts the backend afresh")

    # ------------------------------------------------------------------ running programs

    def execute(
        self,
        program: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, tuple[DType, tuple[int, ...]]],
    ) -> dict[str, np.ndarray]:
        with self._lock:
            proc = self._process()
            rid, self._next_id = self._next_id, self._next_id + 1
            arrays = [np.asarray(a, order="C") for a in inputs.values()]  # (0-D stays 0-D)
            specs = [spec_of(name, a) for name, a in zip(inputs, arrays)]
            wanted = [{"name": n, "dtype": d.value, "shape": list(s)} for n, (d, s) in outputs.items()]
            self._check_bfloat16(proc.hello, program, specs, wanted)
            self._check_limits(proc.hello, specs, outputs)
            request = {"id": rid, "op": "run", "program": program, "inputs": specs, "outputs": wanted}
            deadline = time.monotonic() + self.timeout
            try:
                proc.channel.send(request, arrays, deadline)
                reply = decode_header(proc.channel.read_line(deadline, MAX_REPLY_HEADER))
                return self._answer(proc, rid, reply, program, outputs, deadline)
            except Timeout:
                self._fail(f"did not answer request {rid} within {self.timeout:g} s")
            except StreamClosed as e:
                self._fail(f"ended while running request {rid}: it {e}")
            except ProtocolError as e:
                self._fail(f"broke the protocol answering request {rid}: it {e}")
            raise AssertionError("unreachable: _fail raises")

    def _check_bfloat16(self, hello: dict, program: str, specs: list[dict], wanted: list[dict]) -> None:
        """Refuse, before sending, a bfloat16 program to a backend that did not announce bfloat16
        (a backend written before the dtype existed would misread its bytes)."""
        if DType.BFLOAT16.value in hello["dtypes"]:
            return
        uses = [a["name"] for a in specs + wanted if a["dtype"] == DType.BFLOAT16.value]
        if uses or "as_bfloat" in program or " bf16" in program:
            what = f"'{uses[0]}' is bfloat16" if uses else "it converts to bfloat16"
            raise TileDeviceError(
                f"{self.id} cannot run this program: {what}, and the backend's dtypes "
                f"({', '.join(hello['dtypes'])}) do not include bfloat16",
                None,
                hint="convert with as_float(X, 32), or run it on a device with bfloat16 "
                "(python -m tile devices)",
            )

    def _check_limits(self, hello: dict, specs: list[dict], outputs: Mapping) -> None:
        limit = (hello.get("limits") or {}).get("max_bytes")
        if limit is None:
            return
        total = sum(spec["nbytes"] for spec in specs)
        total += sum(math.prod(s) * d.numpy.itemsize for d, s in outputs.values())
        if total > limit:
            raise TileResourceError(
                f"{self.id} takes at most {limit} bytes of arrays per run; this one needs {total}",
                None,
                hint="the backend's handshake sets this limit (limits.max_bytes)",
            )

    def _answer(self, proc: _Process, rid: int, reply: dict, program: str, outputs: Mapping, deadline: float):
        got = reply.get("id")
        if got != rid or isinstance(got, bool):
            raise ProtocolError(f"answered with the id {_json(got)}; the request's id is {rid}")
        ok = reply.get("ok")
        if ok is False:
            self._raise_error(reply.get("error"), program)
        if ok is not True:
            raise ProtocolError(f"answered 'ok': {_json(ok)}, not true or false")
        specs = parse_specs(reply.get("outputs"), "outputs")
        names = [s.name for s in specs]
        if sorted(names) != sorted(outputs):
            raise ProtocolError(f"answered the outputs {names}; the program's outputs are {list(outputs)}")
        for s in specs:
            dtype, shape = outputs[s.name]
            if (s.dtype, s.shape) != (dtype, shape):
                raise ProtocolError(
                    f"answered {s.dtype.value}{list(s.shape)} for output '{s.name}'; "
                    f"the program makes {dtype.value}{list(shape)}"
                )
        return proc.channel.read_arrays(specs, deadline)

    def _raise_error(self, error, program: str):
        """Raise what an ``ok: false`` reply says: a refusal with a Tile error class as that class
        (same message, so a program is refused alike), anything else as a ``TileBackendError``."""
        if not isinstance(error, dict):
            raise ProtocolError(f"answered 'ok': false with the error {_json(error)}, not an object")
        kind, kind_name, message = error.get("kind"), error.get("type"), error.get("message")
        hint, line, col = error.get("hint"), error.get("line"), error.get("col")
        if not isinstance(message, str) or not isinstance(kind_name, str):
            raise ProtocolError(
                f"answered an error without a 'type' and a 'message' (strings): {_json(error)}"
            )
        if hint is not None and not isinstance(hint, str):
            hint = str(hint)
        cls = getattr(tile.errors, kind_name, None)
        known = isinstance(cls, type) and issubclass(cls, TileError)
        if kind == "refused" and known:
            span = None
            if is_count(line) and is_count(col) and line > 0 and col > 0:
                span = Span(line, col, 1, Source(program, f"<program sent to {self.id}>"))
            raise cls(message, span, hint)
        if kind == "refused":
            what = "refused the program with an error Tile does not have"
        elif kind == "failed":
            what = "failed to run the program"
        else:
            what = f"answered an error of the unknown kind {_json(kind)}"
        tail = self._proc.stderr.text().rstrip() if self._proc is not None else ""
        shown = "\n".join("    " + ln for ln in tail.splitlines()[-20:])
        raise TileBackendError(
            f"{self.id} {what}: {kind_name}: {message}"
            + (f"\nits stderr ends with:\n{shown}" if shown else ""),
            None,
            hint=hint,
        )

    def close(self) -> None:
        """Say bye and let the backend leave (killed if it lingers). A later call starts it again."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            proc.finalizer.detach()
            if proc.popen.poll() is None:
                try:
                    proc.channel.send({"op": "bye"}, (), time.monotonic() + 1.0)
                except ProtocolError:
                    pass
            _stop(proc.popen, grace=2.0)
