"""PlaidML 0.7.0 in a worker process: run a Tile program from numpy inputs, survive its crashes.

PlaidML aborts (SIGABRT) on many invalid programs and hangs on an unbounded index, so it never runs
in the caller's process: ``PlaidML`` keeps one worker process (``python -m backends.plaidml.worker
--serve``) and sends it pickled requests; a crash or a time-out becomes a ``PeerError`` (kind
``abort`` or ``hang``) and the next request starts a fresh worker. PlaidML's own log (where its
syntax errors are, behind a ``ResourceExhausted: Out of memory``) is kept and attached to errors.

The worker runs on device ``llvm_cpu.0`` with ``PLAIDML_EXPERIMENTAL=1`` (the CPU device is
experimental in 0.7) and the wheel's own ``share/plaidml/*.json`` configs, so no ``plaidml-setup``
and no ``~/.plaidml`` are needed. Install (enum34, a declared dependency, breaks Python 3.11)::

    pip install cffi six && pip install plaidml==0.7.0 --no-deps
"""

from __future__ import annotations

import os
import pickle
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

ENV = {"PLAIDML_EXPERIMENTAL": "1", "PLAIDML_DEVICE_IDS": "llvm_cpu.0"}
INSTALL = "pip install cffi six && pip install plaidml==0.7.0 --no-deps"
_ROOT = Path(__file__).resolve().parents[2]  # the directory holding `backends`


class PeerError(Exception):
    """PlaidML did not produce a result: ``kind`` is ``error`` (it raised), ``abort`` (the process
    died, e.g. SIGABRT) or ``hang`` (no answer within the time limit)."""

    def __init__(self, kind: str, message: str, log: str = ""):
        super().__init__(f"PlaidML {kind}: {message}" + (f"\n{log}" if log else ""))
        self.kind = kind
        self.message = message
        self.log = log


def output_names(source: str) -> list[str]:
    m = re.search(r"->\s*\(([^)]*)\)", source)
    if not m:
        raise ValueError("not a Tile function: no '-> (outputs)'")
    return [n.strip() for n in m.group(1).split(",") if n.strip()]


class PlaidML:
    """A PlaidML 0.7 worker process; ``run(source, inputs)`` returns ``{output: array}``."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, **ENV}
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "backends.plaidml.worker", "--serve"]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env)

    def _log_since(self, offset: int) -> str:
        self._log.seek(offset)
        text = self._log.read().decode(errors="replace")
        self._log.seek(0, os.SEEK_END)
        lines = [ln for ln in text.splitlines() if not ln.startswith("INFO:plaidml:")]
        return "\n".join(lines[-20:])

    def run(self, source: str, inputs: Mapping[str, np.ndarray | int], timeout: float | None = None) -> dict:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        offset = self._log.seek(0, os.SEEK_END)
        # A Python int is bound as a plaidml.Integer, which PlaidML takes as a size (docs §6.3.1).
        arrays = {k: v if isinstance(v, int) else np.asarray(v) for k, v in inputs.items()}
        request = pickle.dumps((source, arrays, output_names(source)))
        try:
            proc.stdin.write(struct.pack("<Q", len(request)) + request)
            proc.stdin.flush()
            reply = _read_message(proc.stdout, time.monotonic() + (timeout or self.timeout))
        except TimeoutError:
            self._kill()
            raise PeerError("hang", f"no result within {timeout or self.timeout:g} s") from None
        except (EOFError, BrokenPipeError):
            code = proc.wait()
            self._proc = None
            why = f"signal {-code}" if code < 0 else f"exit status {code}"
            raise PeerError("abort", f"the PlaidML process died ({why})", self._log_since(offset)) from None
        status, payload = pickle.loads(reply)
        if status == "ok":
            return payload
        raise PeerError("error", payload, self._log_since(offset))

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._kill()
        self._proc = None


def _read_message(stream, deadline: float) -> bytes:
    fd = stream.fileno()
    data = b""
    need = 8
    header = True
    while len(data) < need:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, need - len(data))
        if not chunk:
            raise EOFError
        data += chunk
        if header and len(data) == 8:
            need = 8 + struct.unpack("<Q", data)[0]
            header = False
    return data[8:]


_why_unavailable: list[str | None] = []


def not_installed() -> str | None:
    """Why PlaidML 0.7.0 cannot even be imported here, or None. Cheap: it imports nothing and
    starts no process (listing devices without PlaidML costs nothing)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("plaidml") is None:
        return f"plaidml 0.7.0 is not installed (optional; install it with `{INSTALL}`)"
    try:
        version = importlib.metadata.version("plaidml")
    except importlib.metadata.PackageNotFoundError:
        version = "of unknown version"
    if version != "0.7.0":
        return f"plaidml {version} is installed; Tile runs PlaidML 0.7.0 only (`{INSTALL}`)"
    return None


def unavailable() -> str | None:
    """None when PlaidML 0.7 runs a matrix product correctly here, else why not (once per process:
    where it is installed, the probe starts a worker)."""
    if not _why_unavailable:
        _why_unavailable.append(not_installed() or _probe())
    return _why_unavailable[0]


def _probe() -> str | None:
    peer = PlaidML(timeout=60.0)
    try:
        a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.float32).reshape(3, 1)
        got = peer.run(
            "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }", {"A": a, "B": b}
        )
    except PeerError as e:
        return f"plaidml 0.7.0 is installed but does not run: {e}"
    finally:
        peer.close()
    if not np.array_equal(got["C"], a @ b):
        return f"plaidml 0.7.0 gave a wrong result for a probe program: {got['C'].tolist()}"
    return None


# ------------------------------------------------------------------------------ worker process


def _serve() -> None:
    """The worker: read requests on stdin, answer on the original stdout. PlaidML's own prints
    (its lexer echoes some characters) go to stderr with its log, never into the protocol."""
    import logging

    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for k, v in ENV.items():
        os.environ.setdefault(k, v)
    import plaidml

    logging.getLogger("plaidml").setLevel(logging.WARNING)
    ctx = plaidml.Context()
    dev = plaidml.Device(ctx, plaidml.devices(ctx, limit=10)[0])
    stdin = sys.stdin.buffer
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        source, inputs, outputs = pickle.loads(stdin.read(struct.unpack("<Q", header)[0]))
        try:
            reply = ("ok", _execute(plaidml, ctx, dev, source, inputs, outputs))
        except Exception as e:  # PlaidMLError and whatever the wrapper raises: report, keep serving
            reply = ("error", f"{type(e).__name__}: {e}")
        data = pickle.dumps(reply)
        channel.write(struct.pack("<Q", len(data)) + data)
        channel.flush()


def _dtypes(plaidml) -> dict:
    D = plaidml.DType
    return {
        np.dtype(np.bool_): D.BOOLEAN,
        np.dtype(np.int8): D.INT8,
        np.dtype(np.int16): D.INT16,
        np.dtype(np.int32): D.INT32,
        np.dtype(np.int64): D.INT64,
        np.dtype(np.uint8): D.UINT8,
        np.dtype(np.uint16): D.UINT16,
        np.dtype(np.uint32): D.UINT32,
        np.dtype(np.uint64): D.UINT64,
        np.dtype(np.float16): D.FLOAT16,
        np.dtype(np.float32): D.FLOAT32,
        np.dtype(np.float64): D.FLOAT64,
    }


def _execute(plaidml, ctx, dev, source: str, inputs: dict, outputs: list[str]) -> dict:
    to_plaidml = _dtypes(plaidml)
    to_numpy = {v: k for k, v in to_plaidml.items()}
    function = plaidml.Function(source)
    tensors = {}
    for name, arr in inputs.items():
        if isinstance(arr, int):
            tensors[name] = plaidml.Integer(arr)
            continue
        arr = np.array(arr, order="C")  # (np.ascontiguousarray would make a 0-D array 1-D)
        t = plaidml.Tensor(dev, plaidml.Shape(ctx, to_plaidml[arr.dtype], *arr.shape))
        with t.mmap_discard(ctx) as view:
            view.copy_from_ndarray(arr)
            view.writeback()
        tensors[name] = t
    invoker = plaidml.Invoker(ctx, function, tensors)
    results = {}
    for name in outputs:
        shape = invoker.get_output_shape(name)
        t = plaidml.Tensor(dev, shape)
        invoker.set_output(name, t)
        results[name] = (t, to_numpy[shape.dtype], tuple(d.size for d in shape.dimensions))
    invoker.invoke()
    out = {}
    for name, (t, dtype, dims) in results.items():
        arr = np.zeros(dims, dtype)
        with t.mmap_current() as view:
            view.copy_to_ndarray(arr)
        out[name] = arr
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        print(f"usage: python -m backends.plaidml.worker --serve   (the PlaidML worker; needs `{INSTALL}`)")
        sys.exit(2)
