"""Input arrays for the command lines: ``--inputs IN.npz``, ``--shape I=2x3:int8``, ``--seed``.

Inputs missing from the npz are filled with seeded random small integers (exact in every dtype)
when their shape is known: from ``--shape``, from dimensions other inputs already bind, or
because they are 0-D. A 0-D input used as a size gets a whole number from 0 to 6.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping

import numpy as np

from tile import ast
from tile.dtypes import DType
from tile.errors import TileInputError
from tile.size_inputs import size_uses
from tile.typed import TensorType


def parse_shape_spec(spec: str) -> tuple[str, tuple[int, ...], DType]:
    """``I=2x3`` / ``I=2x3:int8`` / ``I=`` (0-D) -> (name, shape, dtype)."""
    if "=" not in spec:
        raise TileInputError(f"bad --shape '{spec}'", hint="write NAME=2x3 or NAME=2x3:int8 (NAME= for 0-D)")
    name, rest = spec.split("=", 1)
    dims_text, _, dtype_text = rest.partition(":")
    try:
        dtype = DType(dtype_text) if dtype_text else DType.FLOAT32
    except ValueError:
        raise TileInputError(
            f"unknown dtype '{dtype_text}' in --shape '{spec}'",
            hint="use bool, int8..int64, uint8..uint64 or float16/32/64",
        ) from None
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
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise TileInputError(f"cannot read '{path}' as an .npz archive: {e}", hint=hint) from None


def random_array(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator) -> np.ndarray:
    """Small integers: -3..3 (0..6 unsigned, 0..1 bool), exact in every dtype."""
    if dtype is DType.BOOL:
        return rng.integers(0, 2, shape).astype(bool)
    lo = 0 if (dtype.is_int and not dtype.is_signed) else -3
    return rng.integers(lo, lo + 7, shape).astype(dtype.numpy)


def gather_inputs(
    program: ast.Program, given: Mapping[str, np.ndarray], shape_specs: list[str], seed: int = 0
) -> dict[str, np.ndarray]:
    """The arrays for every input of ``program``: given ones first, the rest made up."""
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
    out = dict(given)
    dims: dict[str, int] = {}
    for name, arr in out.items():
        decl = declared.get(name)
        if decl is not None and decl.dims is not None and len(decl.dims) == np.ndim(arr):
            dims.update({d: int(s) for d, s in zip(decl.dims, np.shape(arr))})
    rng = np.random.default_rng(seed)
    sizes = size_uses(program)
    # Inputs given a --shape first, so their dimensions can size the others.
    ordered = sorted(declared.items(), key=lambda kv: kv[0] not in specs)
    for name, decl in ordered:
        if name in out:
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
            raise TileInputError(
                f"no array for input '{name}'{why}",
                decl.span,
                hint=f"put '{name}' in the --inputs npz or give --shape "
                f"{name}={'x'.join(['2'] * len(decl.dims or (1, 2)))}",
            )
        if name in sizes and shape == ():  # a size input: a made-up size is a whole number 0..6
            out[name] = np.asarray(rng.integers(0, 7), dtype=dtype.numpy)
        else:
            out[name] = random_array(shape, dtype, rng)
        if decl.dims is not None and len(decl.dims) == len(shape):
            for d, s in zip(decl.dims, shape):
                dims.setdefault(d, s)
    return out


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
                hint="use bool, int8..int64, uint8..uint64 or float16/32/64 arrays",
            ) from None
        types[name] = TensorType(dt, tuple(int(d) for d in arr.shape))
    return types


def add_input_arguments(parser, inputs_help: str = "an .npz archive with one array per input") -> None:
    """The ``--inputs``, ``--shape`` and ``--seed`` options every command that runs a program takes."""
    parser.add_argument("--inputs", help=inputs_help)
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=2x3[:dtype]",
                        help="make up a random small-integer input of this shape (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed for made-up inputs (default 0)")
