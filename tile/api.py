"""The Python API: ``compile`` / ``compile_file`` for a device, gradients by value (``grad_values``)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from tile import ast, lint
from tile.dtypes import DType
from tile.errors import TileInputError
from tile.parser import parse, read_source
from tile.settings import check as check_settings
from tile.tensor import Tensor, dtype_of, zeros_on


def grad_values(
    program: str | ast.Program,
    inputs: Mapping[str, np.ndarray],
    wrt: Sequence[str] | None = None,
    cotangents: Mapping[str, np.ndarray] | None = None,
    precision: str = "native",
    custom: Mapping[str, str | ast.Program] | None = None,
    *,
    seed: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """``{input: gradient}`` of ``sum(cotangents[O] * O)`` over the outputs, by the reference
    interpreter.

    ``cotangents`` gives the output gradients by output name, each taken in its output's dtype;
    outputs not in it get all-ones, so the default is the gradient of the sum of all outputs. Each
    gradient has its input's dtype (in the ``native`` precision). (``seed=`` is its old name, kept
    for a while with a ``DeprecationWarning``: on the command line ``--seed`` is the random seed.)
    """
    import ref_interp  # the oracle; imported here so the language package does not depend on it
    from tile.autodiff import gradient

    if seed is not None:
        warnings.warn("grad_values(seed=...) is now cotangents=...", DeprecationWarning, stacklevel=2)
        cotangents = seed if cotangents is None else cotangents

    prog = parse(program) if isinstance(program, str) else program
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    dtypes = {k: DType.of(v.dtype) for k, v in arrays.items()}
    shapes = {k: tuple(v.shape) for k, v in arrays.items()}
    g = gradient(prog, wrt, custom=custom, dtypes=dtypes, shapes=shapes)
    forward = ref_interp.run(prog, arrays, precision) if g.cotangents else {}
    feed = dict(arrays)
    for out, cot in g.cotangents.items():
        given = (cotangents or {}).get(out)
        value = forward[out]
        dtype = np.float64 if value.dtype == object else value.dtype
        if given is None:
            feed[cot] = np.ones(value.shape, dtype=dtype)
        else:  # in its output's dtype, as the gradient program was derived: a float64 cotangent of
            # a float32 output would widen every gradient to float64 (exact mode: kept as given)
            given = np.asarray(given)
            feed[cot] = given if value.dtype == object else given.astype(dtype, copy=False)
    result = ref_interp.run(g.program, feed, precision)
    return {x: result[name] for x, name in g.gradients.items()}


class Executable:
    """A Tile program ready to run on a device; call it with the input arrays.

    It is compiled on first use for each set of input shapes and dtypes (Tile sizes come from the
    inputs), and the compiled kernels are kept for later calls; backends also cache them on disk.
    """

    def __init__(self, program: ast.Program, device: str, settings: Mapping | None):
        self.program = program
        self.device = device
        self.settings = dict(settings or {})
        self._compiled: dict[tuple, object] = {}
        self._last = None  # the CompiledProgram of the last call, for profile()
        self._size_inputs: dict | None = None  # tile.size_inputs.size_uses, found at the first call
        # the inputs' names, shapes and dtypes as given -> a program of _compiled: picks the same
        # program as last time they were seen without typing the inputs again; not used where
        # values matter too (a program with 0-D inputs used as sizes) or before the first call
        # found that out (``_size_inputs``)
        self._quick: dict[tuple, object] = {}
        # ``backends.lane.resident_call``, once the first compile has loaded the backends: a call
        # whose inputs and outputs are all tensors of a host device, on their addresses
        self._resident = None

    def __call__(
        self,
        *inputs: Mapping[str, np.ndarray | Tensor] | np.ndarray | Tensor,
        out: Mapping[str, Tensor] | None = None,
        resident: bool | None = None,
        **arrays: np.ndarray | Tensor,
    ) -> dict[str, np.ndarray | Tensor]:
        """Run on the inputs: numpy arrays, or ``tile.Tensor``s on this device, given as keywords
        (``f(A=a, B=b)``), as one mapping (``f({"A": a, "B": b})``), or positionally in the order
        of the ``function (...)`` header (``f(a, b)``, and ``f(a, B=b)``).

        ``out={"O": t}`` writes output ``O`` into the tensor ``t`` (same shape, dtype, device) and
        returns ``t``; ``resident=True`` (default: the ``resident_outputs`` setting) returns the
        other outputs as new tensors on the device instead of numpy arrays. An input named ``out``
        or ``resident`` goes in the ``inputs`` mapping."""
        given = self._named(inputs, arrays)  # a dict of this call's own
        key = []  # the quick key's items (``_quick``), made in the same walk
        for k, v in given.items():
            t = type(v)
            if t is Tensor:
                key.append((k, v._shape, v._dtype))
                continue
            if t is not np.ndarray:
                if isinstance(v, Tensor):
                    key.append((k, v._shape, v._dtype))
                    continue
                v = given[k] = np.asarray(v)  # (a value replaced, no key added: the walk goes on)
            key.append((k, v.shape, v.dtype))
        if resident is None:
            resident = bool(self.settings.get("resident_outputs", False))
        if self.device == "interp":
            import ref_interp

            refuse_tensors(given, out, resident)
            return ref_interp.run(self.program, given, self.settings.get("precision", "native"))
        quick = None if self._size_inputs is None or self._size_inputs else tuple(key)
        compiled = self._quick.get(quick) if quick is not None else None
        if compiled is None:
            compiled = self._compiled_for(given)
            if quick is not None:
                self._quick[quick] = compiled
        self._last = compiled
        if out and not resident and self._resident is not None:
            done = self._resident(compiled, given, out)
            if done is not None:
                return done
        return compiled.run(given, out, resident)

    def prepare(self, *inputs: Mapping[str, np.ndarray | Tensor] | np.ndarray | Tensor, **arrays) -> object:
        """Compile for these inputs' shapes and dtypes now, without running (a later call with such
        inputs starts at once): what ``python -m tile run`` times as the compile time. Takes the
        inputs as a call does. Returns the compiled program (None on ``interp``, which compiles
        nothing)."""
        given = self._named(inputs, arrays)
        if self.device == "interp":
            return None
        return self._compiled_for(
            {k: v if isinstance(v, Tensor) else np.asarray(v) for k, v in given.items()}
        )

    def _named(self, inputs: tuple, arrays: dict) -> dict:
        """The call's inputs by name: ``arrays`` (the keywords) with one mapping or the positional
        arrays (in declaration order) added; too many, or one given twice, is a TileInputError."""
        if not inputs:
            return arrays
        if len(inputs) == 1 and (inputs[0] is None or isinstance(inputs[0], Mapping)):
            return {**inputs[0], **arrays} if inputs[0] else arrays
        names = [i.name for i in self.program.inputs]
        header = f"the inputs, in order, are: {', '.join(names) or '(none)'}"
        if any(isinstance(v, Mapping) for v in inputs):
            raise TileInputError(
                "a mapping of inputs must be the only positional argument", None,
                hint=f"pass f({{'A': a, ...}}), f(a, b, ...) or f(A=a, ...); {header}",
            )
        if len(inputs) > len(names):
            raise TileInputError(
                f"{len(inputs)} positional inputs given to a program of {len(names)}", None, hint=header
            )
        twice = [n for n in names[: len(inputs)] if n in arrays]
        if twice:
            raise TileInputError(
                f"input '{twice[0]}' is given both positionally and by name", None,
                hint=f"give each input once; {header}",
            )
        return {**dict(zip(names, inputs)), **arrays}

    def _compiled_for(self, given: Mapping):
        """The program compiled for these inputs' shapes and dtypes (and size values): typed,
        keyed, and built at the first call that needs it."""
        from tile.inputs import input_types
        from tile.size_inputs import size_key, size_uses

        host = {k: stand_in(v) for k, v in given.items()}  # shapes and dtypes, no copies
        types = input_types(self.program, host)
        key = tuple(sorted((k, t.dtype.value, t.shape) for k, t in types.items()))
        # The values of 0-D inputs used as sizes are shapes too: another value, another build.
        if self._size_inputs is None:
            self._size_inputs = size_uses(self.program)
        key += size_key(self._size_inputs, host)
        compiled = self._compiled.get(key)
        if compiled is None:
            from backends import driver, registry
            from backends.lane import resident_call

            self._resident = resident_call

            start = time.perf_counter()
            bound = driver.bind_inputs(self.program, host)  # `=` checked from the shapes, as the
            device = registry.get(self.device)  # interpreter checks it
            settings, tuning = tuned(bound, device, self.settings)
            compiled = driver.compile_bound(bound, device, settings)
            compiled.tuning = tuning  # what the tuner timed and chose (None: not tuned)
            self._compiled[key] = compiled
            if os.environ.get("TILE_DEBUG", "0") >= "1":
                shapes = ", ".join(f"{k}{list(np.shape(v))}" for k, v in host.items())
                generated = getattr(compiled, "build_seconds", None)
                of_which = f" (code generation {generated:.3f} s)" if generated is not None else ""
                print(f"tile: compiled for {shapes} on {self.device} in {time.perf_counter() - start:.3f} s"
                      f"{of_which}; the first call that follows includes one-time start-up",
                      file=sys.stderr)
        return compiled

    def profile(self) -> list[tuple[str, float]]:
        """(kernel name, seconds) of each kernel of the last call, timed by the device: the kernel
        time without launch and copy overheads (waits for the call to finish)."""
        if self._last is None:
            raise TileInputError(
                "profile() reports the last call's kernels, and there was none",
                None,
                hint="call the program first (on a compiled device, not 'interp')",
            )
        return self._last.profile()


def tuned(bound, device, settings: dict) -> tuple[dict, object]:
    """``settings`` with ``{"tune": True}`` made concrete: the config with the tuned tilings and
    the code generator's tuned knobs (``backends.tune``, timed once and cached on disk), and the
    ``Tuning`` (None where nothing was tuned)."""
    from backends import driver
    from backends.hal import Device
    from backends.tune import tune, with_choices

    if not settings.get("tune") or not settings.get("optimize", True) or not isinstance(device, Device):
        return settings, None
    config = driver.config_for(device, settings)
    if config is None:
        return settings, None
    tuning = tune(bound, device, config, settings)
    return {**settings, **tuning.settings, "config": with_choices(config, tuning.choices)}, tuning


def stand_in(value: np.ndarray | Tensor) -> np.ndarray:
    """What typing and binding see of an input: the array itself, or for a tensor an array of its
    shape and dtype that takes no memory (its value only when it is 0-D: it may give a size)."""
    if not isinstance(value, Tensor):
        return value
    if value.ndim == 0:
        return value.numpy()
    return np.broadcast_to(np.zeros((), value.dtype), value.shape)


def refuse_tensors(given: Mapping, out: Mapping | None, resident: bool) -> None:
    """The interpreter computes on numpy arrays: device tensors, ``out=`` and ``resident`` are
    errors there, not silent copies."""
    hint = "compile for a device (tile.compile(src, device='llvm_cpu.0')), or pass t.numpy()"
    for name, v in given.items():
        if isinstance(v, Tensor):
            raise TileInputError(
                f"input '{name}' is a tensor on {v.device}; the interpreter takes numpy arrays", None, hint
            )
    if out or resident:
        raise TileInputError("the interpreter has no device memory for out= or resident outputs", None, hint)


def compile(
    program: str | ast.Program, device: str = "llvm_cpu.0", settings: Mapping | None = None
) -> Executable:
    """``program`` (Tile text or a parsed ``tile.Program``; ``compile_file`` reads a file) for
    ``device`` (an id from ``python -m tile devices``, a plugin's included; ``"interp"`` is the
    reference interpreter; ``"external:COMMAND"`` a backend in another process,
    docs/new_target.md). Only that device's backend is loaded.

    Refused here rather than at the first call: syntax errors, unknown functions and names (what
    ``python -m tile check`` finds without shapes), an unknown device id (a ``TileDeviceError``
    listing the available ones), unknown settings, a bad config file; text that looks like a file
    path is a ``TileInputError`` saying to read the file. A likely index typo in a contraction is a
    ``tile.TileIndexWarning`` (given once). ``settings``:

    * ``{"cache": False}`` bypasses the disk caches (compiled kernels, and built programs keyed by
      source, shapes, settings and device: a new process calling a program built before neither
      lowers nor optimizes it, ``backends.progcache``);
    * ``{"config": "F.json"}`` optimizes with that target config (a file, or a built-in config's
      name such as ``"opencl_gpu_tiled"``) instead of the device's own;
    * ``{"strict": True}`` skips the passes that may reorder aggregation and sums float16 and
      bfloat16 matrix products in float32, so float results are bit-identical to the
      interpreter's (docs/semantics.md §8.3);
    * ``{"optimize": False}`` compiles the lowered program as it is;
    * ``{"max_buffer_bytes": N, "max_total_bytes": M}`` lower the device's memory limits that
      every buffer (and all of them together) is checked against before anything is allocated
      (docs/semantics.md §8.4);
    * ``{"resident_outputs": True}`` returns outputs as ``tile.Tensor``s left on the device (as
      the call's ``resident=True``);
    * ``{"tune": True}`` times the cost model's best few tilings on the device at the first call
      for each shape and keeps the fastest (``backends.tune``; remembered in the disk cache).

    Backends read more (``tile.settings.KNOWN`` lists them all); an unknown name is a
    ``TileSettingsError`` here."""
    check_settings(settings)
    if isinstance(program, str):
        refuse_path(program)
    elif not isinstance(program, ast.Program):
        refuse_source(program)
    prog = parse(program) if isinstance(program, str) else program
    return _checked(prog, device, settings)


def compile_file(
    path: str | os.PathLike, device: str = "llvm_cpu.0", settings: Mapping | None = None
) -> Executable:
    """``compile`` for the program in the file ``path`` (its errors and warnings name the file); a
    path that cannot be read is a ``TileInputError`` naming it."""
    check_settings(settings)
    return _checked(parse(read_program_file(path), os.fspath(path)), device, settings)


def read_program_file(path: str | os.PathLike) -> str:
    """The text of the program file ``path``; a ``TileInputError`` naming the path (and what to
    pass instead) when it is no path or cannot be read."""
    try:
        name = os.fspath(path)
    except TypeError:
        raise TileInputError(
            f"compile_file expects a file path (str or os.PathLike), not {type(path).__name__}",
            None,
            hint="pass the path of a .tile file; tile.compile(text) takes the program text itself",
        ) from None
    try:
        return read_source(name)
    except FileNotFoundError:
        problem = "does not exist"
    except IsADirectoryError:
        problem = "is a directory, not a file"
    except OSError as e:
        problem = f"cannot be read: {e.strerror or e}"
    raise TileInputError(
        f"the program file '{name}' {problem}",
        None,
        hint=f"check the path (relative paths start at {os.getcwd()}); tile.compile(text) takes "
        "program text instead of a file",
    )


def refuse_source(program: object) -> None:
    """A ``TileInputError`` for a program that is neither Tile text nor a parsed ``tile.Program``."""
    what = type(program).__name__
    if isinstance(program, (bytes, bytearray)):
        hint = "decode it first: tile.compile(data.decode('utf-8'))"
    elif isinstance(program, os.PathLike):
        hint = f"for a file, call tile.compile_file({os.fspath(program)!r})"
    else:
        hint = "pass the program text, e.g. tile.compile('function (A[N]) -> (B) { B = A + 1; }')"
    raise TileInputError(
        f"tile.compile expects Tile source text (a str) or a parsed tile.Program, not {what}",
        None,
        hint=hint,
    )


def _checked(prog: ast.Program, device: str, settings: Mapping | None) -> Executable:
    lint.early_check(prog)
    lint.warn(prog)
    if device != "interp":
        from backends import driver, registry

        # fail now: an unknown device (a TileDeviceError listing the ids), a bad config (located)
        driver.check_config(registry.get(device), settings)
    return Executable(prog, device, settings)


def refuse_path(text: str) -> None:
    """A ``TileInputError`` when program text is a file's path instead (``tile.compile("mm.tile")``):
    no ``function`` header, one line, and it names an existing file or ends in ``.tile``."""
    stripped = text.strip()
    if "function" in stripped or "\n" in stripped or not stripped:
        return
    if stripped.endswith(".tile") or os.path.isfile(stripped):
        raise TileInputError(
            f"'{stripped}' looks like a file path, not Tile program text",
            None,
            hint=f"read the file first, tile.compile(open({stripped!r}).read()), or call "
            f"tile.compile_file({stripped!r})",
        )


def tensor(array, device: str = "llvm_cpu.0") -> Tensor:
    """A copy of ``array`` in ``device``'s memory, to pass to programs compiled for that device;
    on a device that can use the memory ``array`` is in (``cuda.N``: a torch CUDA tensor,
    ``__cuda_array_interface__``, DLPack), ``array`` itself, not a copy."""
    wrap = getattr(_device(device), "wrap", None)
    if wrap is not None:
        got = wrap(array)
        if got is not None:
            return got
    arr = np.asarray(array)
    dt = dtype_of(arr.dtype, "the array")
    t = empty(arr.shape, dt, device)
    t.write(arr)
    return t


def empty(shape: Sequence[int], dtype=np.float32, device: str = "llvm_cpu.0") -> Tensor:
    """A tensor of ``shape`` and ``dtype`` on ``device``, for a program's ``out=`` (its contents
    start as zero bytes)."""
    dt = dtype_of(dtype, "the tensor")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise TileInputError(f"a tensor's sizes cannot be negative: {shape}", None, hint="use sizes >= 0")
    return zeros_on(_device(device), shape, dt)


def _device(device: str):
    from backends import registry

    if device == "interp":
        raise TileInputError(
            "the reference interpreter has no device memory: tensors live on a compiled device",
            None,
            hint="pass numpy arrays to an 'interp' program; pick a device id from `python -m tile devices`",
        )
    dev = registry.get(device)  # an unknown id: a TileDeviceError listing the available ones
    if not hasattr(dev, "executor"):
        raise TileInputError(
            f"{device} runs whole programs and has no device memory for tensors",
            None,
            hint="pass numpy arrays to its programs",
        )
    return dev
