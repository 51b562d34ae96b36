"""Backends in another process (``external:COMMAND``) over the tile-external protocol.

The well-behaved backend is ``python -m tile serve`` (the reference server); the misbehaving ones
are modes of ``tests/external_backends/rogue.py``. Every answer is compared with the interpreter
on integer-valued inputs, so float results compare exactly.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tile
from backends import registry
from backends.external import ExternalDevice
from backends.external.protocol import (
    Channel,
    ProtocolError,
    StreamClosed,
    Timeout,
    encode_header,
    parse_specs,
)
from backends.program import ProgramRun, render, stage_config
from tile.errors import TileBackendError, TileDeviceError, TileError, TileResourceError, TileRuntimeError
from tile.inputs import input_types

ROOT = Path(__file__).resolve().parent.parent
ROGUE = Path(__file__).resolve().parent / "external_backends" / "rogue.py"
PY = shlex.quote(sys.executable)
SERVE = f"{PY} -m tile serve --target"

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
TWO_OUT = "function (A[N], B[N]) -> (S, D) { S = A * B + 1; D[] = +(A[i] * B[i]); }"
DOUBLE_WRITE = "function (A[N]) -> (O) { O[i: 2] = =(A[i + j]), j < 2; }"


def _llvm_missing() -> str | None:
    try:
        registry.get("llvm_cpu.0")
    except TileDeviceError as e:
        return e.message
    return None


needs_llvm = pytest.mark.skipif(_llvm_missing() is not None, reason=f"llvm_cpu.0: {_llvm_missing()}")


def ints(rng, shape, dtype=np.float32):
    return rng.integers(-4, 5, size=shape).astype(dtype)


def matmul_inputs(rng, m=2, k=3, n=4):
    return {"A": ints(rng, (m, k)), "B": ints(rng, (k, n))}


def run_on(dev: ExternalDevice, src: str, inputs: dict) -> dict:
    """What ``tile.compile`` does for a program device, on a device the test made (own timeouts)."""
    prog = tile.parse(src)
    return ProgramRun(tile.bind(prog, input_types(prog, inputs), inputs), dev)(inputs)


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_array_equal(got[k], want[k])


@pytest.fixture
def rogue(tmp_path):
    """``rogue(mode, *args, once=True, timeout=..., start_timeout=...)``: a device running the
    rogue backend; with ``once`` only its first process misbehaves (later ones serve ``interp``)."""
    made: list[ExternalDevice] = []

    def make(mode: str, *args: str, once: bool = True, timeout: float = 30, start_timeout: float = 30):
        argv = [sys.executable, str(ROGUE), mode, *args]
        if once:
            argv += ["--once", str(tmp_path / f"{mode}.started")]
        dev = ExternalDevice(shlex.join(argv), timeout=timeout, start_timeout=start_timeout)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.close()


@pytest.fixture
def compiled_id():
    """Ids given to ``tile.compile`` in a test: their devices are closed after it."""
    ids: list[str] = []
    yield ids.append
    for i in ids:
        registry.get(i).close()


# ------------------------------------------------------------------------ round trips


@needs_llvm
@pytest.mark.parametrize("served", ["llvm_cpu.0", "interp"])
def test_programs_run_through_the_server_as_on_the_interpreter(served, compiled_id):
    target = f"external:{SERVE} {served}"
    compiled_id(target)
    rng = np.random.default_rng(0)
    starts = registry.get(target).starts  # (an earlier test may have used this id)
    mm, two = tile.compile(MATMUL, target), tile.compile(TWO_OUT, target)
    mm_ref, two_ref = tile.compile(MATMUL, "interp"), tile.compile(TWO_OUT, "interp")
    for m, k, n in [(2, 3, 4), (2, 3, 4), (5, 1, 3)]:  # a repeat, then other shapes
        x = matmul_inputs(rng, m, k, n)
        assert_same(mm(x), mm_ref(x))
        y = {"A": ints(rng, (k + 2,)), "B": ints(rng, (k + 2,))}
        assert_same(two(y), two_ref(y))
    z = {"A": ints(rng, (3, 2), np.int32), "B": ints(rng, (2, 2), np.int32)}
    assert_same(tile.compile(MATMUL, target)(z), mm_ref(z))
    assert registry.get(target).starts - starts == 1  # one process served it all


def test_zero_dim_and_empty_arrays_keep_their_shapes(compiled_id):
    target = f"external:{SERVE} interp"
    compiled_id(target)
    src = "function (A[N], S[], E[K]) -> (O, T, F) { O = A * S; T[] = +(A[i]); F = E + 1; }"
    x = {"A": np.arange(3, dtype=np.float32), "S": np.full((), 2, np.float32), "E": np.zeros(0, np.int8)}
    shapes = {"O": (3,), "T": (), "F": (0,)}
    dtypes = {"O": tile.dtypes.DType.FLOAT32, "T": tile.dtypes.DType.FLOAT32, "F": tile.dtypes.DType.INT32}
    got = registry.get(target).execute(src, x, {k: (dtypes[k], shapes[k]) for k in shapes})
    assert_same(got, tile.compile(src, "interp")(x))
    assert_same(tile.compile(src, target)(x), tile.compile(src, "interp")(x))  # through ProgramRun too


@needs_llvm
def test_server_output_never_mixes_with_debug_prints(compiled_id):
    # TILE_DEBUG=3 prints every kernel's generated source to stdout: the server must send it to stderr
    target = f"external:env TILE_DEBUG=3 {SERVE} llvm_cpu.0"
    compiled_id(target)
    x = matmul_inputs(np.random.default_rng(1))
    assert_same(tile.compile(MATMUL, target)(x), tile.compile(MATMUL, "interp")(x))


def test_a_refused_program_is_refused_alike_through_the_protocol(compiled_id):
    target = f"external:{SERVE} interp"
    compiled_id(target)
    a = np.arange(4, dtype=np.float32)
    with pytest.raises(TileError) as want:
        tile.compile(DOUBLE_WRITE, "interp")(A=a)
    # sent as is, past the client's own checks: the server's refusal crosses the protocol
    dev = registry.get(target)
    with pytest.raises(TileRuntimeError) as got:
        dev.execute(DOUBLE_WRITE, {"A": a}, {"O": (tile.dtypes.DType.FLOAT32, (2,))})
    starts = dev.starts
    assert type(got.value) is type(want.value) and got.value.message == want.value.message
    with pytest.raises(type(want.value)) as compiled:
        tile.compile(DOUBLE_WRITE, target)(A=a)
    assert compiled.value.message == want.value.message
    # a syntax error keeps its class, message and place (line and column in the text sent)
    bad = "function (A[N]) -> (O) {\n  O = A +;\n}"
    with pytest.raises(TileError) as parsed:
        tile.parse(bad)
    with pytest.raises(type(parsed.value)) as sent:
        dev.execute(bad, {"A": a}, {"O": (tile.dtypes.DType.FLOAT32, (4,))})
    assert sent.value.message == parsed.value.message
    assert (sent.value.span.line, sent.value.span.col) == (parsed.value.span.line, parsed.value.span.col)
    assert dev.starts == starts  # refusals are answers: the process stays


# ------------------------------------------------------------------------ misbehaving backends

FAULTS = [
    # mode, fails at the handshake (else at the first run), words the error must contain
    (
        "die",
        True,
        ["ended before its handshake", "exited with status 3", "cannot initialize the frobnicator"],
    ),
    ("garbage_handshake", True, ["not JSON", "Welcome to my backend"]),
    ("wrong_version", True, ["version 99", "versions 1 and 2"]),
    ("silent", True, ["sent no handshake within 2 s"]),
    ("garbage_reply", False, ["broke the protocol answering request 1", "not UTF-8"]),
    ("wrong_id", False, ["with the id 8; the request's id is 1"]),
    ("wrong_shape", False, ["float32[2, 4, 2] for output 'C'", "makes float32[2, 4]"]),
    ("wrong_dtype", False, ["int32[2, 4] for output 'C'"]),
    ("bad_nbytes", False, ["says nbytes 36", "takes 32 bytes"]),
    ("unknown_dtype", False, ["'complex64'"]),
    ("missing_output", False, ["answered the outputs []"]),
    ("truncated", False, ["inside a message (16 of 32 array bytes came)"]),
    ("hang", False, ["did not answer request 1 within 2 s"]),
    ("crash", False, ["exited with status 139", "segmentation fault (simulated)"]),
]


@pytest.mark.parametrize("mode, at_start, words", FAULTS, ids=[f[0] for f in FAULTS])
def test_a_misbehaving_backend_fails_the_call_by_name_and_is_restarted(rogue, mode, at_start, words):
    dev = rogue(mode, timeout=2, start_timeout=2)
    x = matmul_inputs(np.random.default_rng(2))
    start = time.monotonic()
    with pytest.raises(TileBackendError) as e:
        if at_start:
            dev.capabilities  # noqa: B018 - the first look starts it and reads the handshake
        else:
            run_on(dev, MATMUL, x)
    assert time.monotonic() - start < 10
    message = e.value.message
    assert message.startswith(dev.id + " ")
    for w in words:
        assert w in message
    assert "rogue: started in mode " + mode in message  # the tail of its stderr
    # the process was killed; the next call starts a fresh one (which behaves: see --once)
    dev.timeout = dev.start_timeout = 30
    assert_same(run_on(dev, MATMUL, x), tile.compile(MATMUL, "interp")(x))
    assert dev.starts == 2


def test_a_backend_that_fails_cleanly_keeps_running(rogue):
    dev = rogue("failed", once=False)
    x = matmul_inputs(np.random.default_rng(3))
    for _ in range(2):
        with pytest.raises(TileBackendError, match="failed to run the program: FrobError: no frobnicator"):
            run_on(dev, MATMUL, x)
    assert dev.starts == 1
    unknown = rogue("refuse_unknown", once=False)
    with pytest.raises(TileBackendError, match="refused the program with an error Tile does not have"):
        run_on(unknown, MATMUL, x)


def test_a_chatty_backend_does_not_block_on_its_stderr(rogue):
    dev = rogue("noisy", once=False, timeout=20, start_timeout=20)
    x = matmul_inputs(np.random.default_rng(4))
    assert_same(run_on(dev, MATMUL, x), tile.compile(MATMUL, "interp")(x))


def test_the_backend_limit_on_bytes_is_a_resource_error(rogue):
    dev = rogue("tiny_limit", once=False)
    with pytest.raises(TileResourceError, match="at most 64 bytes of arrays per run; this one needs 104"):
        run_on(dev, MATMUL, matmul_inputs(np.random.default_rng(5), 2, 3, 4))  # 24 + 48 + 32 bytes


@pytest.mark.parametrize("stage", ["stripe", "optimized"])
def test_the_program_is_sent_at_the_stage_the_backend_announces(rogue, tmp_path, stage):
    record = tmp_path / "programs.txt"
    dev = rogue(f"record_{stage}", str(record), once=False)
    assert (dev.stage, dev.config) == (stage, "llvm_cpu")
    x = matmul_inputs(np.random.default_rng(6))
    got = run_on(dev, MATMUL, x)  # the rogue answers 0x41 bytes: values are not the point here
    assert got["C"].shape == (2, 4)
    prog = tile.parse(MATMUL)
    bound = tile.bind(prog, input_types(prog, x), x)
    assert record.read_text() == render(bound, stage, stage_config(dev, None))


def test_tile_compile_takes_its_timeout_from_the_environment(monkeypatch, compiled_id):
    monkeypatch.setenv("TILE_EXTERNAL_TIMEOUT", "1.5")
    target = f"external:{PY} {shlex.quote(str(ROGUE))} hang"
    compiled_id(target)
    start = time.monotonic()
    with pytest.raises(TileBackendError, match="did not answer request 1 within 1.5 s"):
        tile.compile(MATMUL, target)(matmul_inputs(np.random.default_rng(7)))
    assert time.monotonic() - start < 8
    monkeypatch.setenv("TILE_EXTERNAL_TIMEOUT", "soon")
    with pytest.raises(TileDeviceError, match="TILE_EXTERNAL_TIMEOUT is 'soon'"):
        ExternalDevice("whatever")


def test_a_command_that_cannot_start_is_named():
    dev = ExternalDevice("/nonexistent/backend --fast")
    with pytest.raises(TileBackendError, match="external:/nonexistent/backend --fast could not start"):
        dev.stage  # noqa: B018
    with pytest.raises(TileDeviceError, match="cannot split the command"):
        ExternalDevice("backend 'unbalanced")


def test_close_says_bye_and_a_later_call_starts_again():
    dev = ExternalDevice(f"{SERVE} interp")
    x = matmul_inputs(np.random.default_rng(8))
    run_on(dev, MATMUL, x)
    popen = dev._proc.popen
    dev.close()
    assert popen.returncode == 0  # it left on the bye (not killed)
    assert_same(run_on(dev, MATMUL, x), tile.compile(MATMUL, "interp")(x))
    assert dev.starts == 2
    dev.close()


# ------------------------------------------------------------------------ the server on raw bytes


def request(rid, program: str, arrays: dict, outputs=()) -> bytes:
    from backends.external.protocol import spec_of, wire_bytes

    header = {"id": rid, "op": "run", "program": program}
    header["inputs"] = [spec_of(k, a) for k, a in arrays.items()]
    header["outputs"] = list(outputs)
    return encode_header(header) + b"".join(bytes(wire_bytes(a)) for a in arrays.values())


def replies(data: bytes) -> list[tuple[dict, dict]]:
    """The messages a server wrote (the handshake first), with their arrays."""
    r, w = os.pipe()
    feeder = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    feeder.start()
    channel, out = Channel(r, -1), []
    try:
        while True:
            try:
                header = json.loads(channel.read_line(time.monotonic() + 10, 1 << 20))
            except StreamClosed:
                return out
            specs = parse_specs(header["outputs"], "outputs") if header.get("ok") else []
            out.append((header, channel.read_arrays(specs, time.monotonic() + 10)))
    finally:
        feeder.join()
        os.close(r)


def serve(data: bytes, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tile", "serve", "--target", "interp", *args]
    return subprocess.run(cmd, input=data, capture_output=True, timeout=timeout)


def test_server_answers_malformed_requests_and_goes_on():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    bad_dtype = encode_header(
        {
            "id": 2,
            "op": "run",
            "program": "x",
            "inputs": [{"name": "A", "dtype": "complex64", "shape": [2], "nbytes": 16}],
        }
    )
    data = (
        b"this is not json\n"
        + bad_dtype
        + b"\x00" * 16
        + encode_header({"id": 3, "op": "frobnicate"})
        + request(4, "function (M, A[N]) -> (O) { O = A * 2; }", {"M": np.ones(3, bool), "A": a})[:-25]
        + b"\x02"  # the last bool byte of M (the 24 bytes of A follow)
        + request(4, "function (A[N]) -> (O) { O = A * 2; }", {"A": a})[-24:]
        + request(5, "function (A[M, N]) -> (O) { O = A * 2; }", {"A": a})
        + encode_header({"op": "bye"})
        + b"never read\n"
    )
    r = serve(data)
    assert r.returncode == 0, r.stderr.decode()
    (hello, _), *answers = replies(r.stdout)
    assert hello["protocol"] == "tile-external" and hello["version"] == 2 and hello["stage"] == "tile"
    assert [h["id"] for h, _ in answers] == [None, 2, 3, 4, 5]
    for h, _ in answers[:4]:
        assert h["ok"] is False and h["error"]["kind"] == "protocol"
    assert "not JSON" in answers[0][0]["error"]["message"]
    assert "complex64" in answers[1][0]["error"]["message"]
    assert "unknown op 'frobnicate'" in answers[2][0]["error"]["message"]
    assert "bytes other than 0 and 1" in answers[3][0]["error"]["message"]
    np.testing.assert_array_equal(answers[4][1]["O"], a * 2)


def test_server_exits_2_on_a_stream_it_cannot_follow():
    uncountable = encode_header({"id": 1, "op": "run", "program": "x", "inputs": [{"name": "A"}]})
    r = serve(uncountable + b"\x01\x02\x03")
    assert r.returncode == 2 and b"cannot be counted" in r.stderr
    assert replies(r.stdout)[1][0]["error"]["kind"] == "protocol"
    a = np.arange(4, dtype=np.float32)
    cut = request(1, "function (A[N]) -> (O) { O = A; }", {"A": a})[:-3]  # EOF inside its bytes
    r = serve(cut)
    assert r.returncode == 2 and b"inside a message" in r.stderr
    assert serve(b"").returncode == 0  # EOF between messages: done


def test_server_exits_when_no_request_comes_within_its_timeout():
    cmd = [sys.executable, "-m", "tile", "serve", "--target", "interp", "--timeout", "0.5"]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
        p.wait(timeout=60)  # its stdin stays open: it leaves on its own
        out, err = p.stdout.read(), p.stderr.read()
    assert p.returncode == 0 and b"no request for 0.5 s" in err
    assert [h["protocol"] for h, _ in replies(out)] == ["tile-external"]


# ------------------------------------------------------------------------ the protocol's framing


def test_arrays_of_every_dtype_cross_a_pipe_exactly():
    rng = np.random.default_rng(9)
    arrays = {d.value: ints(rng, (2, 3), d.numpy) for d in tile.dtypes.DType if d.value != "bool"}
    arrays["bool"] = rng.integers(0, 2, (3,)).astype(bool)
    arrays["scalar"] = np.float64(2.5) * np.ones(())
    arrays["empty"] = np.zeros((0, 4), np.int16)
    arrays["big_endian"] = np.arange(5, dtype=">i4")
    arrays["strided"] = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    r, w = os.pipe()
    try:
        from backends.external.protocol import spec_of

        specs = [spec_of(k, a) for k, a in arrays.items()]
        Channel(-1, w).send({"outputs": specs}, arrays.values(), time.monotonic() + 5)
        channel = Channel(r, -1)
        header = json.loads(channel.read_line(time.monotonic() + 5, 1 << 20))
        got = channel.read_arrays(parse_specs(header["outputs"], "outputs"), time.monotonic() + 5)
    finally:
        os.close(r)
        os.close(w)
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype.newbyteorder("=") and got[k].shape == a.shape, k
        np.testing.assert_array_equal(got[k], a)
        assert got[k].flags.writeable


@pytest.mark.parametrize(
    "entry, problem",
    [
        (
            {"name": "A", "dtype": "float32", "shape": [2], "nbytes": 7},
            "says nbytes 7, but float32[2] takes 8",
        ),
        ({"name": "A", "dtype": "complex64", "shape": [2], "nbytes": 16}, "has the dtype 'complex64'"),
        ({"name": "A", "dtype": "int8", "shape": [-1], "nbytes": 0}, "not a list of non-negative ints"),
        ({"dtype": "int8", "shape": [1], "nbytes": 1}, "has no name"),
    ],
)
def test_array_specs_that_do_not_add_up_are_protocol_errors(entry, problem):
    with pytest.raises(ProtocolError, match=re.escape(problem)):
        parse_specs([entry], "outputs")


def test_reads_end_at_their_deadline_and_bool_bytes_are_checked():
    r, w = os.pipe()
    try:
        channel = Channel(r, -1)
        start = time.monotonic()
        with pytest.raises(Timeout):
            channel.read_line(time.monotonic() + 0.3, 100)
        assert time.monotonic() - start < 2
        os.write(w, b"x" * 200)
        with pytest.raises(ProtocolError, match="longer than 100 bytes"):
            channel.read_line(time.monotonic() + 1, 100)
        os.write(w, b"\x00\x01\x02")
        spec = parse_specs([{"name": "M", "dtype": "bool", "shape": [3], "nbytes": 3}], "x")
        with pytest.raises(ProtocolError, match="bytes other than 0 and 1"):
            Channel(r, -1).read_arrays(spec, time.monotonic() + 1)
    finally:
        os.close(r)
        os.close(w)


# ------------------------------------------------------------------------ the conformance suite


def conformance(target: str, failures: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable, "-m", "pytest", "conformance/test_conformance.py", "-p", "no:cacheprovider", "-q",
        "--target", target, "--conformance-examples=3", f"--conformance-failures={failures}", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@needs_llvm
def test_conformance_passes_through_the_server(tmp_path):
    r = conformance(
        f"external:{SERVE} llvm_cpu.0", tmp_path, "-k", "contractions or elementwise", timeout=150
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "2 passed" in r.stdout
    compared = re.search(r"total: (\d+) examples compared, 0 failing", r.stdout)
    assert compared and int(compared.group(1)) > 0, r.stdout[-2000:]


def test_conformance_fails_a_backend_that_answers_wrong_values(tmp_path):
    target = f"external:{PY} {shlex.quote(str(ROGUE))} wrong_values"
    start = time.monotonic()
    r = conformance(target, tmp_path, "-k", "contractions", "-x", timeout=150)
    assert time.monotonic() - start < 150
    assert r.returncode == 1, r.stdout[-4000:] + r.stderr[-2000:]
    folders = [p.parent for p in tmp_path.rglob("case.json")]
    assert folders, r.stdout[-4000:]
    for folder in folders:
        meta = json.loads((folder / "case.json").read_text())
        # a backend answering wrong values is caught on a valid program (its elements differ) or on
        # one the interpreter refuses (it answers where it must refuse), whichever is drawn first
        assert meta["target"] == target
        assert "elements differ" in meta["problem"] or "the interpreter refuses it" in meta["problem"]
        assert f"target {target}" in (folder / "case.tile").read_text().splitlines()[0]
