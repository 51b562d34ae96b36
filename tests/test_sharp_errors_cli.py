"""The command lines' side of issue 37, item 4: a missing-input hint that works when followed, and
Ctrl-C ending ``tile run`` and ``ref_interp run`` quietly with status 130 (as Unix tools do)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tile.cli import main as tile_main
from tile.errors import TileInputError
from tile.inputs import gather_inputs
from tile.parser import parse

ROOT = Path(__file__).resolve().parent.parent
CONV = ROOT / "examples" / "conv.tile"


def hinted_shapes(hint: str) -> list[str]:
    """The ``--shape`` arguments a hint proposes."""
    return re.findall(r"--shape (\S+)", hint)


# ---------------------------------------------------------------- missing-input hints


def test_the_hint_keeps_the_sizes_other_inputs_bind():
    """I fixes CI at 3: the hint for K says 3 there, not 2 (which the next run would refuse)."""
    program = parse(CONV.read_text(), str(CONV))
    with pytest.raises(TileInputError) as err:
        gather_inputs(program, {}, ["I=1x8x8x3"])
    assert "no array for input 'K' (KH, KW, CO unknown)" in err.value.message
    assert hinted_shapes(err.value.hint) == ["K=2x2x3x2"]


SHARED = """function (A[N, M], B[M, P], C[P]) -> (O) {
    T[n, p: N, P] = +(A[n, m] * B[m, p]);
    O[n, p: N, P] = +(T[n, p] * C[p]);
}
"""


def test_the_hint_lists_every_input_it_cannot_size_once():
    """Neither A nor B can be sized; C can once B is: the hint gives A and B, with M shared."""
    with pytest.raises(TileInputError) as err:
        gather_inputs(parse(SHARED), {}, [])
    assert hinted_shapes(err.value.hint) == ["A=2x2", "B=2x2"]
    with pytest.raises(TileInputError) as err:
        gather_inputs(parse(SHARED), {}, ["A=4x5"])
    assert hinted_shapes(err.value.hint) == ["B=5x2"]


@pytest.mark.parametrize(
    "program, args",
    [
        ("conv", ["--shape", "I=1x8x8x3"]),
        ("conv", ["--shape", "K=2x2x5x4"]),
        ("shared", []),
        ("shared", ["--shape", "A=4x5"]),
        ("shared", ["--shape", "C=7"]),
    ],
)
def test_following_the_hint_runs(program, args, tmp_path, capsys):
    """The command the hint proposes succeeds (run in-process: the same main as the CLI's)."""
    path = CONV if program == "conv" else tmp_path / "shared.tile"
    if program == "shared":
        path.write_text(SHARED)
    command = ["run", str(path), "--target", "interp", *args]
    assert tile_main(command) == 1
    hint = capsys.readouterr().err.splitlines()[-1]
    assert hint.startswith("hint: put ")
    followed = [*command, *(a for s in hinted_shapes(hint) for a in ("--shape", s))]
    assert tile_main(followed) == 0, capsys.readouterr().err
    assert "O: float32[" in capsys.readouterr().out


# ---------------------------------------------------------------- Ctrl-C

SLOW_MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n: M, N] = +(A[m, k] * B[k, n]); }\n"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TILE_DEBUG": "1"}


def interrupt(proc: subprocess.Popen, ready: threading.Event | None = None) -> int:
    """Send SIGINT to ``proc`` once it is running (``ready``); its exit status."""
    if ready is not None:
        assert ready.wait(120), "the command never started running"
    time.sleep(0.5)  # well into the slow part
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the command did not stop after SIGINT")
    return proc.returncode


def test_ctrl_c_during_tile_run_exits_130_quietly(tmp_path):
    """``tile run`` on a program that runs for minutes (many repeats): SIGINT once it has compiled
    (``TILE_DEBUG=1`` says so on stderr) ends it at once, status 130, no traceback."""
    path = tmp_path / "mm.tile"
    path.write_text(SLOW_MATMUL)
    command = [sys.executable, "-m", "tile", "run", str(path), "--shape", "A=256x256", "--shape",
               "B=256x256", "--repeat", "1000000"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=tmp_path)
    ready, lines = threading.Event(), []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("tile: compiled"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    status = interrupt(proc, ready)
    reader.join(10)
    err = "".join(lines)
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.stdout.read() == ""  # it was stopped before printing results


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe (os.mkfifo) to know it started")
def test_ctrl_c_during_ref_interp_run_exits_130_quietly(tmp_path):
    """``ref_interp run`` of an exact-precision matrix product (minutes of Fractions): the program
    comes through a named pipe, so once the pipe is open the command is past its imports and in
    its own code; SIGINT then ends it, status 130, no traceback."""
    fifo = tmp_path / "mm.tile"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "ref_interp", "run", str(fifo), "--precision", "exact", "--shape",
               "A=200x200", "--shape", "B=200x200"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd=tmp_path)
    try:
        with open(fifo, "w") as f:  # returns once the command opens the pipe to read the program
            f.write(SLOW_MATMUL)
    except BaseException:
        proc.kill()
        raise
    status = interrupt(proc)
    out, err = proc.communicate()
    assert status == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "C:" not in out, shlex.join(command)
