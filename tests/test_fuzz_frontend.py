"""Front-end fuzz: whatever bytes arrive, the front end answers with a ``TileError`` or a result.

Each input goes decode -> parse -> ``bind_symbolic`` (what ``python -m tile check`` does) -> the
printer round trip -> bind to made-up inputs of sizes 1..4 -> ``ref_interp.run`` with a small point
limit. Any other exception, or more than ``BUDGET_S`` seconds on one input, fails with the input
shown. ``--fuzz-examples=N`` sets the examples per test (default 500); counts are printed at the end.
Inputs come from random text, random Tile tokens assembled into statements, and byte-level
mutations of the valid programs in ``tests/fuzz_corpus.py``.
"""

from __future__ import annotations

import collections
import re
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ref_interp.cli import main as interp_main
from ref_interp.run import run
from tests.fuzz_corpus import programs
from tile.autodiff import grad
from tile.bind import bind_symbolic
from tile.cli import main as tile_main
from tile.dtypes import DType
from tile.errors import TileError, TileSyntaxError
from tile.inputs import random_array
from tile.lexer import KEYWORDS, OPERATORS
from tile.parser import MAX_NESTING, decode_source, parse
from tile.printer import format_program

BUDGET_S = 5
MAX_POINTS = 10**5
COUNTS: collections.Counter[str] = collections.Counter()


class Hang(Exception):
    """One input took more than ``BUDGET_S`` seconds."""


def _alarm(signum, frame):
    raise Hang(f"more than {BUDGET_S} s")


def made_up_inputs(program, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Small arrays for every input: each dimension name one size in 1..4, undeclared ranks 0..2."""
    sizes: dict[str, int] = {}
    out = {}
    for inp in program.inputs:
        if inp.dims is None:
            shape = tuple(int(s) for s in rng.integers(1, 5, rng.integers(0, 3)))
        else:
            shape = tuple(sizes.setdefault(d, int(rng.integers(1, 5))) for d in inp.dims)
        dtype = DType.FLOAT32 if rng.random() < 0.7 else DType.INT32
        out[inp.name] = random_array(shape, dtype, rng)
    return out


def front_end(data: bytes | str) -> str:
    """Run ``data`` through every stage (text skips the decoding); raise what the stages raise."""
    text = decode_source(data, "<fuzz>") if isinstance(data, bytes) else data
    program = parse(text, "<fuzz>")
    bind_symbolic(program, {}, {})
    assert parse(format_program(program)) == program, "printer round trip changed the program"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # TilePrecisionWarning and numpy's overflow notes
        run(program, made_up_inputs(program, np.random.default_rng(len(data))), max_points=MAX_POINTS)
    return "accepted"


def check_input(data: bytes | str) -> None:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, BUDGET_S)
    try:
        outcome = front_end(data)
    except TileError as e:
        str(e).encode("utf-8")  # the CLIs print it: it must be printable, whatever the input held
        outcome = "rejected"
    except Exception as e:
        COUNTS["other"] += 1
        raise AssertionError(f"{type(e).__name__}: {e}\ninput: {data!r}") from e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    COUNTS["tried"] += 1
    COUNTS[outcome] += 1


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    line = (
        f"front-end fuzz: {COUNTS['tried']} inputs, {COUNTS['rejected']} TileError, "
        f"{COUNTS['accepted']} accepted, {COUNTS['other']} other"
    )
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + line)


def fuzz_settings(request) -> settings:
    return settings(
        max_examples=request.config.getoption("--fuzz-examples"),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# ------------------------------------------------------------------------------------ strategies
_TILE_CHARS = "".join(sorted({c for op in OPERATORS for c in op})) + "AaBbIiNjkMO019_. \n\t'/"
_WORDS = (
    *KEYWORDS,
    *OPERATORS,
    "A",
    "B",
    "C",
    "O",
    "N",
    "M",
    "i",
    "j",
    "k",
    "0",
    "1",
    "2",
    "3",
    "-1",
    "2.5",
    "1e3",
    "exp",
    "max",
    "min",
    "select",
    "cond",
    "index",
    "shape",
    "reshape",
    "gather",
    "as_int",
    "as_float",
    "sqrt",
    "tanh",
    "//",
    "\n",
    "2i",
    "no_defract",
    "default",
)
_HEADERS = (
    "",
    "function (A[N], B[N, M]) -> (O) { ",
    "function (A, B[]) -> (O, P) { ",
    "function () -> (O) { ",
)

random_text = st.text(st.characters(codec="utf-8"), max_size=120) | st.text(_TILE_CHARS, max_size=160)
token_text = st.builds(
    lambda head, words, sep, tail: head + sep.join(words) + tail,
    st.sampled_from(_HEADERS),
    st.lists(st.sampled_from(_WORDS), max_size=40),
    st.sampled_from(("", " ")),
    st.sampled_from(("", " }", "; }")),
)


@st.composite
def mutated(draw) -> bytes:
    """A corpus program with a few byte-level edits: insert, delete, replace, duplicate, splice."""
    corpus = programs()
    data = bytearray(draw(st.sampled_from(corpus)).encode())
    for _ in range(draw(st.integers(0, 4))):  # 0: the program itself, run on new sizes
        n = len(data)
        at = draw(st.integers(0, n))
        end = draw(st.integers(at, min(n, at + 12)))
        kind = draw(st.sampled_from(("insert", "delete", "replace", "duplicate", "splice", "token")))
        if kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[at:end]
        elif kind == "replace":
            data[at:end] = draw(st.binary(max_size=4))
        elif kind == "duplicate":
            data[end:end] = data[at:end]
        elif kind == "splice":
            other = draw(st.sampled_from(corpus)).encode()
            start = draw(st.integers(0, len(other)))
            data[at:end] = other[start : start + draw(st.integers(0, 40))]
        else:
            data[at:end] = draw(st.sampled_from(_WORDS)).encode()
    return bytes(data)


# ------------------------------------------------------------------------------------------ tests
def test_corpus_is_not_empty_and_accepted():
    corpus = programs()
    assert len(corpus) > 50, "the fuzz corpus lost its seeds: tests/fuzz_corpus.py reads no programs"
    check_input(corpus[0].encode())


def test_random_text(request):
    @fuzz_settings(request)
    @given(random_text | st.text(max_size=60))
    def inner(text):
        # Text with lone surrogates (as `surrogateescape` decoding makes) has no UTF-8 bytes.
        check_input(text.encode() if text.isascii() or _encodable(text) else text)

    inner()


def test_random_tokens(request):
    @fuzz_settings(request)
    @given(token_text)
    def inner(text):
        check_input(text.encode())

    inner()


def test_mutated_programs(request):
    @fuzz_settings(request)
    @given(mutated())
    def inner(data):
        check_input(data)

    inner()


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# ------------------------------------------------------------------------- regression files
CASES = sorted((Path(__file__).parent / "cases").glob("*.tile"))
# `// expect: ...` holds for both command lines; `// expect run: ...` for the interpreter only
# (`python -m tile check` accepts the file).
_EXPECT = re.compile(r"// expect(?P<run> run)?: (?:ok|(?P<kind>[a-z ]+) (?P<loc>\d+:\d+): (?P<message>.*))")


def test_cases_folder_has_files():
    assert len(CASES) >= 5, "tests/cases/*.tile went missing"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_file(path, capsys):
    """Both command lines read the file and print the located error its first line names (with
    a caret and a hint), or accept it."""
    m = _EXPECT.match(path.read_bytes().split(b"\n", 1)[0].decode())
    assert m, f"{path.name}: the first line must be `// expect: ...`"
    rc = tile_main(["check", str(path)])
    err = capsys.readouterr().err
    interp_rc = interp_main(["run", str(path), "--shape", "A=3"])
    interp_err = capsys.readouterr().err
    if m["kind"] is None:
        assert (rc, interp_rc) == (0, 0), err + interp_err
        check_input(path.read_bytes())
        return
    head = f"{path}:{m['loc']}: {m['kind']}: {m['message']}"
    if m["run"]:
        assert rc == 0, err
    for code, text in ((rc, err), (interp_rc, interp_err))[1 if m["run"] else 0 :]:
        assert code == 1, text
        assert text.startswith(head), text
        assert "^" in text and "\nhint: " in text, text


# ------------------------------------------------------------------------------ nesting limit
def _nested(kind: str, d: int) -> str:
    body = {
        "sum": "A" + " + A" * d,
        "parens": "(" * d + "A" + " + 1.0)" * d,
        "product": "A * (" * d + "A" + ")" * d,
        "calls": "tanh(" * d + "A" + ")" * d,
        "negation": "-" * d + "A",
        "ternary": "A > 0 ? A : " * d + "A",
    }[kind]
    return f"function (A[N]) -> (O) {{ O = {body}; }}"


@pytest.mark.parametrize("kind", ["sum", "parens", "product", "calls", "negation", "ternary"])
def test_deepest_accepted_nesting_runs_everywhere(kind):
    """The deepest program the parser accepts goes through check, the interpreter, the printer
    round trip and ``tile.grad`` (and the gradient runs) within Python's recursion limit; one
    level more is a located syntax error."""
    d = next(d for d in range(MAX_NESTING + 1, 0, -1) if _accepts(_nested(kind, d)))
    assert d >= MAX_NESTING - 2, f"{kind}: only {d} levels accepted"
    with pytest.raises(TileSyntaxError, match=f"nested more than {MAX_NESTING} levels") as info:
        parse(_nested(kind, d + 1))
    assert info.value.span is not None and info.value.hint
    program = parse(_nested(kind, d))
    assert parse(format_program(program)) == program
    bind_symbolic(program, {}, {})
    a = np.arange(3, dtype=np.float32)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        run(program, {"A": a})
        run(grad(program), {"A": a, "DO": np.ones(3, np.float32)})


def _accepts(text: str) -> bool:
    try:
        parse(text)
    except TileSyntaxError:
        return False
    return True
