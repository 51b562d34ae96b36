"""Input arrays for the command lines: ``--inputs IN.npz``, ``--shape I=2x3:int8``, ``--seed`` (and
what else the command lines share: the ``--precision`` help, ``--output`` and closed-pipe checks).

Inputs missing from the npz are filled with seeded random small integers (exact in every dtype)
when their shape is known: from ``--shape``, from dimensions other inputs already bind, or
because they are 0-D. A 0-D input used as a size gets a whole number from 0 to 6.

Every made-up input's size is checked before any is made (``Limits``: a device's or a setting's
bytes per buffer and in all, the interpreter's element count, and always this machine's memory),
and each is filled in its own dtype a slice at a time, so making up an input takes its own
memory and no more.
"""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tile import ast
from tile.dtypes import DType
from tile.errors import TileInputError, TileResourceError
from tile.typed import TensorType

PRECISION_HELP = (
    "native: compute in the declared dtypes (default); float64: float tensors in float64; exact: "
    "float tensors as exact fractions (slow); tf32 / 3xtf32: native, with float32 matrix products' "
    "operands rounded to TF32 (or split into two TF32 parts)"
)


def parse_dtype(name: str, where: str = "") -> DType:
    """The Tile dtype called ``name`` (``float32``, ``int8``, ``bfloat16``, ...): the one reader of
    dtype names, for the command lines' ``--shape`` and the API's ``tile.empty``, so both accept
    the same names. numpy's aliases (``float``, ``double``, ``int``, ``f4``) are refused: ``float``
    is float64 to numpy but float32 to C, and a silent float64 is the wrong guess half the time.
    ``where`` ends the message (`` in --shape 'A=2:float'``)."""
    try:
        return DType(name)
    except ValueError:
        raise TileInputError(
            f"unknown dtype '{name}'{where}",
            None,
            hint=f"Tile's dtypes are {', '.join(d.value for d in DType)} (numpy's aliases such as "
            "'float' or 'int' are not: write float32, float64, int32, ...)",
        ) from None


def parse_shape_spec(spec: str) -> tuple[str, tuple[int, ...], DType]:
    """``I=2x3`` / ``I=2x3:int8`` / ``I=`` (0-D) -> (name, shape, dtype)."""
    if "=" not in spec:
        raise TileInputError(f"bad --shape '{spec}'", hint="write NAME=2x3 or NAME=2x3:int8 (NAME= for 0-D)")
    name, rest = spec.split("=", 1)
    dims_text, _, dtype_text = rest.partition(":")
    dtype = parse_dtype(dtype_text, f" in --shape '{spec}'") if dtype_text else DType.FLOAT32
    try:
        shape = tuple(int(d) for d in dims_text.lower().split("x")) if dims_text.strip() else ()
    except ValueError:
        raise TileInputError(
            f"bad sizes '{dims_text}' in --shape '{spec}'",
            hint="sizes are integers separated by 'x', e.g. 2x3",
        ) from None
    if any(d < 0 for d in shape):
        raise TileInputError(f"negative size in --shape '{spec}'")
    return name.strip(), shape, dtype


def from_npz(arr: np.ndarray) -> np.ndarray:
    """An array as read from an .npz: numpy saves ``ml_dtypes.bfloat16`` as raw 2-byte records
    (``|V2``), which are read back as bfloat16."""
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and arr.dtype.names is None:
        return arr.view(DType.BFLOAT16.numpy)
    return arr


def load_npz(path: str) -> dict[str, np.ndarray]:
    hint = "save inputs with np.savez(path, A=a, B=b)"
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise TileInputError(
            f"input file '{path}' does not exist", hint="check the path; the file is an .npz archive, " + hint
        ) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise TileInputError(
            f"cannot read '{path}' as an .npz archive (it is not a numpy file)", hint=hint
        ) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise TileInputError(
            f"'{path}' holds a single array (.npy), not an .npz archive of named inputs", hint=hint
        )
    try:
        with data:
            return {k: from_npz(data[k]) for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise TileInputError(f"cannot read '{path}' as an .npz archive: {e}", hint=hint) from None


_CHUNK = 1 << 20  # elements drawn at a time: the draws are the same as one call's


def random_array(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator) -> np.ndarray:
    """Small integers: -3..3 (0..6 unsigned, 0..1 bool), exact in every dtype; written into an
    array of ``dtype`` a slice at a time (no int64 array of the whole size on the way)."""
    out = np.empty(shape, dtype=dtype.numpy)
    flat = out.reshape(-1)
    lo, hi = (0, 2) if dtype is DType.BOOL else (0, 7) if dtype.is_int and not dtype.is_signed else (-3, 4)
    for start in range(0, flat.size, _CHUNK):
        stop = min(start + _CHUNK, flat.size)
        flat[start:stop] = rng.integers(lo, hi, stop - start)
    return out


@dataclass(frozen=True)
class Limits:
    """What made-up inputs must fit, each as ``(number, what it is)`` for the message: bytes of
    one input, bytes of all of them, elements of one (the interpreter's index-space limit).
    This machine's memory always bounds the total too."""

    buffer_bytes: tuple[int, str] | None = None
    total_bytes: tuple[int, str] | None = None
    elements: tuple[int, str] | None = None


def host_memorybytes_text() -> int | None:
    """This machine's physical memory, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def bytes_text(n: int) -> str:
    """A byte count as the resource errors word it (with GiB from 1 GiB on)."""
    return f"{n} bytes ({n / 2**30:.1f} GiB)" if n >= 2**30 else f"{n} bytes"


def check_made_up(
    program: ast.Program, planned: Mapping[str, tuple[tuple[int, ...], DType]], limits: Limits | None
) -> None:
    """Refuse, before making any, inputs too large for ``limits`` or for this machine."""
    limits = limits or Limits()
    decls = {i.name: i for i in program.inputs}
    hint = "give smaller --shape sizes, or pass your own arrays with --inputs"
    need = {}
    for name, (shape, dtype) in planned.items():
        elements = int(np.prod(shape, dtype=object))
        need[name] = elements * dtype.numpy.itemsize
        typed = f"{dtype.value}[{', '.join(map(str, shape))}]"
        if limits.elements is not None and elements > limits.elements[0]:
            n, what = limits.elements
            raise TileResourceError(
                f"input '{name}' ({typed}) would have {elements} elements, more than {what} of {n}; "
                "nothing was made up",
                decls[name].span,
                "give smaller --shape sizes, or raise the limit (--max-points, TILE_INTERP_MAX_POINTS)",
            )
        if limits.buffer_bytes is not None and need[name] > limits.buffer_bytes[0]:
            n, what = limits.buffer_bytes
            raise TileResourceError(
                f"input '{name}' ({typed}) would need {bytes_text(need[name])}, over the limit of "
                f"{bytes_text(n)} for one buffer ({what}); nothing was made up",
                decls[name].span,
                hint,
            )
    totals = [t for t in (limits.total_bytes,) if t is not None]
    host = host_memorybytes_text()
    if host is not None:
        totals.append((host, "this machine's memory"))
    total = sum(need.values())
    for n, what in sorted(totals):
        if total > n:
            big = max(need, key=need.__getitem__)
            raise TileResourceError(
                f"the made-up inputs would need {bytes_text(total)} together, over the limit of "
                f"{bytes_text(n)} ({what}); the largest is '{big}' ({bytes_text(need[big])}); "
                "nothing was made up",
                decls[big].span,
                hint,
            )


def gather_inputs(
    program: ast.Program,
    given: Mapping[str, np.ndarray],
    shape_specs: list[str],
    seed: int = 0,
    limits: Limits | None = None,
) -> dict[str, np.ndarray]:
    """The arrays for every input of ``program``: given ones first, the rest made up (each
    checked against ``limits`` and this machine's memory before any is made)."""
    from tile.size_inputs import size_uses  # (through tile.shapes: sympy; not for --help)

    specs = {}
    for spec in shape_specs:
        name, shape, dtype = parse_shape_spec(spec)
        specs[name] = (shape, dtype)
    declared = {i.name: i for i in program.inputs}
    for name in list(specs):
        if name not in declared:
            raise TileInputError(
                f"--shape names '{name}', which is not an input",
                hint=f"the inputs are: {', '.join(declared) or '(none)'}",
            )
    dims: dict[str, int] = {}
    for name, arr in given.items():
        decl = declared.get(name)
        if decl is not None and decl.dims is not None and len(decl.dims) == np.ndim(arr):
            dims.update({d: int(s) for d, s in zip(decl.dims, np.shape(arr))})
    sizes = size_uses(program)
    planned: dict[str, tuple[tuple[int, ...], DType]] = {}
    missing: dict[str, tuple[int, ...]] = {}  # inputs with no known shape -> the shape to propose
    first_missing = None  # (the error's message, the input's span)
    # Inputs given a --shape first, so their dimensions can size the others.
    ordered = sorted(declared.items(), key=lambda kv: kv[0] not in specs)
    for name, decl in ordered:
        if name in given:
            continue
        if name in specs:
            shape, dtype = specs[name]
        elif decl.dims is not None and all(d in dims for d in decl.dims):
            shape, dtype = tuple(dims[d] for d in decl.dims), DType.FLOAT32
        elif name in sizes:
            shape, dtype = (), DType.INT32
        else:
            unknown = [d for d in (decl.dims or ()) if d not in dims]
            why = f" ({', '.join(unknown)} unknown)" if unknown else " (it has no declared dimensions)"
            first_missing = first_missing or (f"no array for input '{name}'{why}", decl.span)
            # The hint's shape: dimensions known so far keep their sizes, the others are 2; it
            # counts as known from here on, as it will when the hint is followed.
            shape = proposed_shape(program, decl, dims)
            missing[name] = shape
        if decl.dims is not None and len(decl.dims) == len(shape):
            for d, s in zip(decl.dims, shape):
                dims.setdefault(d, s)
        if name not in missing:
            planned[name] = (shape, dtype)
    if first_missing is not None:
        shapes = " ".join(f"--shape {n}={'x'.join(map(str, s))}" for n, s in missing.items())
        them = ", ".join(f"'{n}'" for n in missing)
        raise TileInputError(*first_missing, hint=f"put {them} in the --inputs npz or give {shapes}")
    check_made_up(program, planned, limits)
    rng = np.random.default_rng(seed)
    out = dict(given)
    for name, (shape, dtype) in planned.items():
        if name in sizes and shape == ():  # a size input: a made-up size is a whole number 0..6
            out[name] = np.asarray(rng.integers(0, 7), dtype=dtype.numpy)
        else:
            out[name] = random_array(shape, dtype, rng)
    return out


def proposed_shape(program: ast.Program, decl: ast.Input, dims: Mapping[str, int]) -> tuple[int, ...]:
    """A shape to suggest for an input nothing sizes: the sizes ``dims`` already binds, 2 for the
    rest. An input declared without dimensions gets the rank a contraction reads it with, else
    none (a 0-D input broadcasts with anything elementwise)."""
    if decl.dims is not None:
        return tuple(dims.get(d, 2) for d in decl.dims)
    for stmt in program.stmts:
        if isinstance(stmt, ast.Contraction):
            for ref in stmt.operands:
                if ref.name == decl.name:
                    return (2,) * len(ref.indices)
    return ()


def describe(arr: np.ndarray, limit: int = 6) -> str:
    """A short preview of an array for the command line."""
    fmt = {"all": str} if arr.dtype == object else None
    if arr.size <= limit * limit:
        with np.printoptions(linewidth=100):
            return np.array2string(arr, formatter=fmt)
    flat = arr.reshape(-1)
    head = ", ".join(str(x) for x in flat[:limit].tolist())
    return f"[{head}, ...] ({arr.size} elements)"


def input_types(program: ast.Program, inputs: Mapping[str, np.ndarray]) -> dict[str, TensorType]:
    """The Tile type of each given array; unknown, missing and unsupported inputs are errors."""
    declared = {i.name: i for i in program.inputs}
    for name in inputs:
        if name not in declared:
            raise TileInputError(
                f"an array was given for '{name}', which is not an input of this program",
                None,
                hint=f"the inputs are: {', '.join(declared) or '(none)'}",
            )
    types = {}
    for name, decl in declared.items():
        if name not in inputs:
            dims = f"[{', '.join(decl.dims)}]" if decl.dims is not None else ""
            raise TileInputError(
                f"no array given for input '{name}{dims}'",
                decl.span,
                hint="pass one array per declared input",
            )
        arr = np.asarray(inputs[name])
        try:
            dt = DType.of(arr.dtype)
        except TypeError:
            raise TileInputError(
                f"input '{name}' has dtype {arr.dtype}, which Tile does not have",
                decl.span,
                hint="use bool, int8..int64, uint8..uint64, float16/32/64 or ml_dtypes.bfloat16 arrays",
            ) from None
        types[name] = TensorType(dt, tuple(int(d) for d in arr.shape))
    return types


def add_input_arguments(parser, inputs_help: str = "an .npz archive with one array per input") -> None:
    """The ``--inputs``, ``--shape`` and ``--seed`` options every command that runs a program takes."""
    parser.add_argument("--inputs", help=inputs_help)
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=2x3[:dtype]",
                        help="make up a random small-integer input of this shape (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed for made-up inputs (default 0)")


def check_writable(path: str | None) -> None:
    """Refuse an ``--output`` whose folder does not exist or cannot be written, before running."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TileInputError(
            f"cannot write '{path}': there is no folder '{folder}'", None, "create it, or write elsewhere"
        )
    if not os.access(folder, os.W_OK):
        raise TileInputError(f"cannot write '{path}': the folder is not writable", None, "write elsewhere")


def quiet_broken_pipe() -> int:
    """The reader of our output went away (``| head``): stop as a Unix tool stopped by SIGPIPE
    does, without a traceback, and without another error when Python flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a tool the signal stopped


def interrupted() -> int:
    """Ctrl-C: stop as a Unix tool stopped by SIGINT does, with status 130 (128 + SIGINT) and
    without a traceback; the terminal has already shown the ^C."""
    return 130
