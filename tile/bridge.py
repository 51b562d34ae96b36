"""What the framework bridges (``tile.torch``, ``tile.jax``) share, without importing a framework:
one Tile function as an operator with a fixed input order, its output types from Tile's own shape
and dtype inference, and its forward and gradient programs compiled per (shapes, dtypes, device)
and kept.

A framework hands it numpy arrays (views of its own tensors where it can) and gets numpy arrays
back; the bridges only translate tensors, registrations and error messages.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tile import ast
from tile.dtypes import DType
from tile.errors import TileError, TileInputError
from tile.parser import parse
from tile.size_inputs import size_uses
from tile.typed import TensorType

Key = tuple  # ((shape, dtype name) per input, in the function's order)


class Op:
    """A Tile function used as an operator: inputs by position, outputs in declared order.

    ``what`` names it in errors (``"tile.torch op 'conv'"``); ``settings`` go to ``tile.compile``.
    Programs whose output shapes depend on input values (0-D inputs used as sizes) are refused: a
    framework must know an output's shape from its inputs' shapes alone. With ``differentiable``
    (the default) a program whose gradient cannot be derived is refused here too, not at its first
    backward (``check_derivable``). It pickles as its source, ``what`` and settings."""

    def __init__(
        self,
        source: str | ast.Program,
        what: str,
        settings: Mapping | None = None,
        differentiable: bool = True,
    ):
        self.program = parse(source) if isinstance(source, str) else source
        self.text = source if isinstance(source, str) else str(source)
        self.digest = hashlib.sha1(self.text.encode()).hexdigest()[:10]
        self.what = what
        self.inputs = tuple(i.name for i in self.program.inputs)
        self.outputs = self.program.output_names
        sizes = size_uses(self.program)
        if sizes:
            name = next(iter(sizes))
            raise TileInputError(
                f"{what}: input '{name}' is used as a size, so output shapes depend on its value, "
                "which a framework's shape inference cannot see",
                next(i.span for i in self.program.inputs if i.name == name),
                hint="write the size into the source (build the text in Python with the number)",
            )
        from tile.api import compile as tile_compile

        self._compile = tile_compile
        self.settings = dict(settings or {})
        tile_compile(self.program, "interp", self.settings)  # refuse unknown names, functions, settings
        self._types: dict[Key, tuple[tuple[tuple[int, ...], np.dtype], ...]] = {}
        self._runs: dict[tuple, tuple] = {}  # (key, device) -> (Executable, CompiledProgram | None)
        self._grads: dict[tuple, tuple] = {}  # (key, wrt, device) -> (runner, Gradient, feeds)
        self._derived: dict[tuple, object] = {}  # (key, wrt) -> Gradient; ("jvp", key, wrt) -> Linearization
        self._exes: dict[tuple, tuple] = {}  # (id(program), device) -> (program, Executable)
        self._lock = threading.Lock()
        self.has_gradient = differentiable
        # dtype combinations whose gradient was derived (None: the source alone settled it)
        self._derivable: set | None = None
        if differentiable:
            self._derivable = None if self.check_derivable(None) else set()

    def __reduce__(self):
        return (Op, (self.text, self.what, self.settings, self.has_gradient))

    def check_derivable(self, key: Key | None) -> bool:
        """Derive the gradient program of every float output for every float input, and raise its
        error (``TileTypeError``: no derivative) in the op's terms if it cannot be derived.
        ``key`` None: from the source alone, inputs taken as float32 with symbolic sizes; False
        where that is not conclusive (an input used as an index must be an integer; an input of
        any rank has no shape to write a gradient of), so that the first call of each dtype
        combination checks instead (``key``: its types)."""
        from tile.autodiff import gradient
        from tile.bind import bind_symbolic

        typed: dict = {}
        if key is None:
            if any(i.dims is None for i in self.program.inputs):
                return False
            try:
                bind_symbolic(self.program)
            except TileError:
                return False
        else:
            types = self.tile_types(key)
            typed = {
                "dtypes": {n: t.dtype for n, t in types.items()},
                "shapes": {n: t.shape for n, t in types.items()},
            }
        try:
            gradient(self.program, **typed)
        except (ValueError, TypeError):  # a size the symbolic derivation cannot write: per shape
            if key is not None:
                raise
            return False
        except TileError as e:
            hint = (f"{e.hint}; " if e.hint else "") + (
                "or make a forward-only op with differentiable=False (its backward is then refused)"
            )
            try:
                err = type(e)(f"{self.what}: its gradient cannot be derived: {e.message}", e.span, hint)
            except TypeError:  # a kind with another constructor: as it was
                raise e from None
            err._bridge = True
            raise err from None
        return True

    def _check_dtypes(self, key: Key) -> None:
        """``check_derivable`` for the first call of each dtype combination, where the source alone
        did not settle it."""
        if self._derivable is None:
            return
        dtypes = tuple(np.dtype(d).name for _, d in key)
        if dtypes not in self._derivable:
            self.check_derivable(key)
            self._derivable.add(dtypes)

    def refuse_backward(self) -> None:
        """A forward-only op (``differentiable=False``) refuses a gradient."""
        if not self.has_gradient:
            raise TileInputError(
                f"{self.what} was made with differentiable=False: it has no gradient",
                None,
                hint="make the op without differentiable=False to differentiate it",
            )

    # -- types ---------------------------------------------------------------------------------

    def key(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]) -> Key:
        return tuple(zip(shapes, dtypes))

    def out_types(self, key: Key) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        """``(shape, numpy dtype)`` of each output for inputs of ``key``'s shapes and dtypes
        (typed once per key); a mismatch is the binder's located error, prefixed with the tensors
        the caller gave."""
        found = self._types.get(key)
        if found is None:
            from tile.bind import bind

            bound = self.rephrased(lambda: bind(self.program, self.tile_types(key)), key)
            found = tuple((tuple(int(d) for d in t.shape), t.dtype.numpy)
                          for t in (bound.types[o] for o in self.outputs))
            self._types[key] = found
        return found

    def tile_types(self, key: Key) -> dict[str, TensorType]:
        if len(key) != len(self.inputs):
            raise TileInputError(
                f"{self.what} takes {len(self.inputs)} tensor(s) ({', '.join(self.inputs)}), "
                f"got {len(key)}",
                self.program.inputs[0].span if self.program.inputs else None,
                hint="pass one tensor per input of the Tile function, in its order",
            )
        types = {}
        for name, (shape, dtype) in zip(self.inputs, key):
            try:
                types[name] = TensorType(DType.of(dtype), tuple(shape))
            except TypeError:
                raise TileInputError(
                    f"{self.what}: input '{name}' has dtype {dtype}, which Tile does not have",
                    self._span(name),
                    hint="pass bool, integer or float16/32/64 tensors",
                ) from None
        return types

    def rephrased(self, fn, key: Key):
        """``fn()``, with a ``TileError`` it raises restated in the caller's terms: which op, and
        every tensor given by Tile input name, dtype and shape (same class, span and hint)."""
        try:
            return fn()
        except TileError as e:
            if getattr(e, "_bridge", False):
                raise
            given = ", ".join(f"{n} {np.dtype(d).name}{list(s)}" for n, (s, d) in zip(self.inputs, key))
            try:
                err = type(e)(f"{self.what} called with {given}: {e.message}", e.span, e.hint)
            except TypeError:  # a kind with another constructor: as it was
                raise e from None
            err._bridge = True
            raise err from None

    def _span(self, name: str):
        return next((i.span for i in self.program.inputs if i.name == name), None)

    def symbolic_out_shapes(
        self,
        shapes: Sequence[Sequence[object]],
        dtypes: Sequence[np.dtype],
        minmax: tuple = (max, min),
        equal: Callable[[object, object], bool] | None = None,
    ):
        """``(shape, dtype)`` of each output when some input sizes are symbolic (a framework's
        symbolic integers, e.g. torch ``SymInt``): the sizes typed as sympy symbols, and each output
        size evaluated back with the framework's own integers. None where typing or evaluating
        fails (the caller then specializes to concrete sizes). A dimension name that has a symbol
        in one input and a number (or another symbol) in another is one size: ``equal(a, b)``
        asks the framework to hold them equal (a guard or a runtime check; False: it cannot, and
        the sizes stay apart, so that the mismatch is reported)."""
        import sympy

        from tile.bind import bind

        shapes = self._unified(shapes, equal)
        symbols: dict[str, sympy.Symbol] = {}
        back: dict[sympy.Symbol, object] = {}
        sym_shapes = []
        for shape in shapes:
            dims = []
            for d in shape:
                if isinstance(d, int):
                    dims.append(int(d))
                    continue
                s = symbols.get(str(d))
                if s is None:
                    s = symbols[str(d)] = sympy.Symbol(f"_s{len(symbols)}", positive=True, integer=True)
                    back[s] = d
                dims.append(s)
            sym_shapes.append(tuple(dims))
        key = self.key([tuple(s) for s in sym_shapes], dtypes)
        try:
            bound = self.rephrased(lambda: bind(self.program, self.tile_types(key)), key)
            return [
                (tuple(_evaluate(d, back, minmax) for d in bound.types[o].shape), bound.types[o].dtype.numpy)
                for o in self.outputs
            ]
        except TileError:
            raise
        except Exception:
            return None

    def _unified(self, shapes: Sequence[Sequence[object]], equal) -> list[tuple]:
        """``shapes`` with each symbolic size that a declared dimension name shares with a number
        (an ``nn.Module`` weight's fixed size) replaced by that number, and each symbol it shares
        with another symbol by the first, once ``equal`` holds them equal."""
        same: dict[str, object] = {}  # str(symbol) -> what stands for it

        def resolve(d):
            while not isinstance(d, int) and str(d) in same:
                d = same[str(d)]
            return d

        first: dict[str, object] = {}  # dimension name -> its size where first declared
        for inp, shape in zip(self.program.inputs, shapes):
            if inp.dims is None or len(inp.dims) != len(shape):
                continue
            for dim, d in zip(inp.dims, shape):
                d = resolve(d)
                seen = first.setdefault(dim, d)
                seen = resolve(seen)
                if isinstance(d, int) and isinstance(seen, int) or str(d) == str(seen) or equal is None:
                    continue
                if not equal(seen, d):
                    continue
                if isinstance(d, int):  # the number stands for the symbol
                    same[str(seen)] = d
                    first[dim] = d
                else:
                    same[str(d)] = seen
        return [tuple(resolve(d) for d in shape) for shape in shapes]

    # -- running -------------------------------------------------------------------------------

    def forward(self, device: str, arrays: Sequence[np.ndarray], key: Key) -> list[np.ndarray]:
        """The outputs for ``arrays`` (in input order) on ``device``; on a host-memory device
        C-contiguous inputs are read in place and the outputs are written where they are returned."""
        run = self._forward_run(device, key, arrays)
        inputs = dict(zip(self.inputs, arrays))
        out = run[1].run(inputs) if run[1] is not None else run[0](inputs)
        return [out[o] for o in self.outputs]

    def backward(
        self,
        device: str,
        arrays: Sequence[np.ndarray],
        cotangents: Sequence[np.ndarray | None],
        wrt: Sequence[int],
        key: Key,
    ) -> list[np.ndarray]:
        """The gradients of ``sum(cotangent * output)`` with respect to the inputs at positions
        ``wrt`` only (Tile's gradient program for exactly those inputs, compiled once per key,
        ``wrt`` and device); a missing cotangent counts as zeros."""
        wrt = tuple(wrt)
        if not wrt:
            return []
        run, g, feeds = self._backward_run(device, key, wrt, arrays)
        inputs = self._gradient_feed(g, feeds, arrays, cotangents, key)
        out = run[1].run(inputs) if run[1] is not None else run[0](inputs)
        result = []
        for i in wrt:
            grad = out[g.gradients[self.inputs[i]]]
            shape, dtype = key[i]
            if grad.shape != tuple(shape):
                grad = np.array(np.broadcast_to(grad, shape))
            result.append(grad.astype(dtype, copy=False))
        return result

    # -- running on device tensors ---------------------------------------------------------------

    def device_program(self, device: str, key: Key, wrt: Sequence[int] | None = None) -> tuple:
        """``(CompiledProgram, result names)``: the program ``forward`` (``wrt`` None) or ``backward``
        runs for ``key`` on ``device`` (compiled here if it was not yet), whose ``device`` makes
        ``tile.Tensor``s for it, and the names of its results in the order ``forward_tensors`` /
        ``backward_tensors`` return them (whose shapes and dtypes are ``program.buffers[name]``: a
        gradient's may differ from its input's, ``backward`` broadcasts and converts it)."""
        if wrt is None:
            run, names = self._forward_run(device, key, None), list(self.outputs)
        else:
            run, g, _ = self._backward_run(device, key, tuple(wrt), None)
            names = [g.gradients[self.inputs[i]] for i in wrt]
        if run[1] is None:
            raise ValueError(f"{device} compiles nothing: it runs no tile.Tensors")
        return run[1], names

    def forward_tensors(self, device: str, tensors: Sequence, key: Key, out: Sequence) -> list:
        """``forward`` with ``tile.Tensor`` inputs of ``device_program``'s device, read in place,
        and the outputs written into ``out`` (a ``tile.Tensor`` per output, in order), which come
        back (their events say when the device is done)."""
        program, names = self.device_program(device, key)
        return self._run_tensors(program, dict(zip(self.inputs, tensors)), names, out)

    def backward_tensors(
        self,
        device: str,
        tensors: Sequence,
        cotangents: Sequence,
        wrt: Sequence[int],
        key: Key,
        out: Sequence,
    ) -> list:
        """``backward`` on ``tile.Tensor``s as ``forward_tensors``: the gradients written into ``out``
        (one per ``wrt``, of ``device_program``'s shapes and dtypes), as the program computes them."""
        program, names = self.device_program(device, key, wrt)
        _, g, feeds = self._grads[(key, tuple(wrt), device)]
        return self._run_tensors(program, self._gradient_feed(g, feeds, tensors, cotangents, key), names, out)

    def lane_names(self, device: str, key: Key, wrt: Sequence[int] | None = None) -> tuple:
        """``(CompiledProgram, input names, result names)`` of a program already run for ``key`` on
        ``device`` (``forward``, or ``backward`` for ``wrt``), for a ``backends.lane.Lane`` over
        it: the input names in the caller's order, the op's inputs then (a gradient) each output's
        cotangent, None where the program reads nothing from that place."""
        program, names = self.device_program(device, key, wrt)
        if wrt is None:
            return program, list(self.inputs), names
        _, g, feeds = self._grads[(key, tuple(wrt), device)]
        cots = [g.cotangents.get(o) for o in self.outputs]
        ins = [n if n in feeds else None for n in [*self.inputs, *cots]]
        return program, ins, names

    @staticmethod
    def _run_tensors(program, inputs: Mapping, names: Sequence[str], out: Sequence) -> list:
        result = program.run(inputs, out=dict(zip(names, out)))  # (the runner zeroes what it must)
        return [result[n] for n in names]

    # -- compiling -----------------------------------------------------------------------------

    def _forward_run(self, device: str, key: Key, arrays: Sequence | None) -> tuple:
        """(Executable, CompiledProgram | None) for ``key`` on ``device``, made once; ``arrays``
        (or stand-ins of ``key``'s shapes) to prepare it with."""
        run = self._runs.get((key, device))
        if run is None:
            self.out_types(key)  # a shape or dtype mismatch: in the caller's terms
            self._check_dtypes(key)
            with self._lock:
                run = self._runs.get((key, device)) or self._prepared(
                    self.program, device, _stand_ins(key) if arrays is None else arrays, key
                )
                self._runs[(key, device)] = run
        return run

    def _backward_run(self, device: str, key: Key, wrt: tuple[int, ...], arrays: Sequence | None) -> tuple:
        """(run, Gradient, the gradient program's input names) for ``key``, ``wrt`` and ``device``."""
        entry = self._grads.get((key, wrt, device))
        if entry is None:
            arrays = _stand_ins(key) if arrays is None else arrays
            with self._lock:
                entry = self._grads.get((key, wrt, device)) or self._gradient(device, arrays, wrt, key)
                self._grads[(key, wrt, device)] = entry
        return entry

    def _gradient_feed(self, g, feeds, values: Sequence, cotangents: Sequence, key: Key) -> dict:
        """The gradient program's inputs: the inputs it reads, and each float output's cotangent
        (zeros where it is None)."""
        inputs = {}
        for name, value in zip(self.inputs, values):
            if name in feeds:
                inputs[name] = value
        for o, cot, (shape, dtype) in zip(self.outputs, cotangents, self.out_types(key)):
            name = g.cotangents.get(o)
            if name is not None and name in feeds:
                inputs[name] = np.zeros(shape, dtype) if cot is None else cot
        return inputs

    def differentiable(self, key: Key) -> list[bool]:
        """Which inputs a gradient flows to: the float ones."""
        return [DType.of(d).is_float for _, d in key]

    def _prepared(self, program: ast.Program, device: str, arrays: Mapping | Sequence, key: Key) -> tuple:
        exe = self._executable(program, device)
        feed = arrays if isinstance(arrays, Mapping) else dict(zip(self.inputs, arrays))
        return exe, self.rephrased(lambda: exe.prepare(feed), key)

    def _executable(self, program: ast.Program, device: str):
        """One ``Executable`` of ``program`` on ``device`` for every shape (it compiles each shape
        once): ``tile.compile``'s checks run once, not at every new shape (a dynamic op's forward
        program, and its gradient program derived once, ``_derive``)."""
        slot = (id(program), device)
        found = self._exes.get(slot)
        if found is None or found[0] is not program:
            found = self._exes[slot] = (program, self._compile(program, device, self.settings))
        return found[1]

    def gradient(self, key: Key, wrt: tuple[int, ...]):
        """Tile's gradient program (a ``tile.autodiff.Gradient``) for inputs of ``key``'s types
        with respect to the inputs at positions ``wrt``, the float outputs' cotangents its inputs;
        derived once per key and ``wrt``. A framework may run it as an op of its own (a second
        derivative is the gradient of this program)."""
        from tile.autodiff import gradient

        return self._derive((key, wrt), gradient, key, wrt)

    def linearization(self, key: Key, wrt: tuple[int, ...]):
        """Tile's JVP program (a ``tile.autodiff.jvp.Linearization``) for inputs of ``key``'s types
        and tangents of the inputs at positions ``wrt``: the tangents of the float outputs, derived
        once per key and ``wrt`` (reverse mode twice). A framework runs it as an op of its own, so
        that it is differentiable in turn."""
        from tile.autodiff.jvp import linearize

        return self._derive(("jvp", key, wrt), linearize, key, wrt)

    def _derive(self, slot: tuple, derive, key: Key, wrt: tuple[int, ...]):
        """``derive(program, wrt names, float outputs, dtypes=, shapes=)`` for ``key``'s types, once
        per ``slot``, its errors in the op's terms. Under ``generic`` (an op whose sizes vary) a
        derivation from the dtypes alone, sizes by the declared dimensions' names, serves every
        shape of those dtypes when it had to assume nothing (no ``notes``, see
        ``tile.autodiff.Gradient``): a new length then derives nothing (it was 2-3 ms a length)."""
        self.refuse_backward()
        found = self._derived.get(slot)
        if found is None:
            types = self.tile_types(key)
            floats = [o for o, (_, d) in zip(self.outputs, self.out_types(key)) if DType.of(d).is_float]
            dtypes = {n: t.dtype for n, t in types.items()}
            names = [self.inputs[i] for i in wrt]

            def derived(shapes):
                return derive(self.program, names, floats, dtypes=dtypes, shapes=shapes)

            general = self.settings.get("generic") and slot[0] != "jvp"  # (a Linearization notes nothing)
            found = self._symbolic(slot, key, derived) if general else None
            if found is None:
                found = self.rephrased(lambda: derived({n: t.shape for n, t in types.items()}), key)
            self._derived[slot] = found
        return found

    def _symbolic(self, slot: tuple, key: Key, derived):
        """``derived(None)`` (no shapes), once per ``key``'s dtypes and ``wrt``; None where that
        derivation fails, assumed something (non-empty ``notes``) or is of a kind that records no
        assumptions (no ``notes`` at all)."""
        general = ("symbolic", tuple(d for _, d in key), *(s for s in slot if s is not key))
        if general not in self._derived:
            try:
                g = derived(None)
            except Exception:  # noqa: BLE001 - not derivable without shapes: derived per shape, as before
                g = None
            self._derived[general] = g if getattr(g, "notes", None) == () else None
        return self._derived[general]

    def _gradient(self, device: str, arrays: Sequence[np.ndarray], wrt: tuple[int, ...], key: Key) -> tuple:
        g = self.gradient(key, wrt)
        feeds = {i.name for i in g.program.inputs}
        stand_ins = {}
        for name, arr in zip(self.inputs, arrays):
            if name in feeds:
                stand_ins[name] = arr
        for o, (shape, dtype) in zip(self.outputs, self.out_types(key)):
            name = g.cotangents.get(o)
            if name in feeds:
                stand_ins[name] = np.broadcast_to(np.zeros((), dtype), shape)
        return self._prepared(g.program, device, stand_ins, key), g, feeds


def _stand_ins(key: Key) -> list[np.ndarray]:
    """Arrays of ``key``'s shapes and dtypes, for preparing a program (no memory: broadcast zeros)."""
    return [np.broadcast_to(np.zeros((), dtype), shape) for shape, dtype in key]


def _evaluate(expr, back: Mapping, minmax: tuple):
    """A sympy size expression evaluated with ``back``'s integers for its symbols (``+``, ``*``,
    integer powers, ``floor``/``ceiling`` of a quotient, ``Max``/``Min`` by ``minmax``'s two
    functions): the framework's symbolic integers stay symbolic."""
    import sympy

    if isinstance(expr, int):
        return expr
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return back[expr]
    if expr.is_Add:
        total = 0
        for a in expr.args:
            total = total + _evaluate(a, back, minmax)
        return total
    if expr.is_Mul and all(not (a.is_Rational and not a.is_Integer) for a in expr.args):
        prod = 1
        for a in expr.args:
            prod = prod * _evaluate(a, back, minmax)
        return prod
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        return _evaluate(expr.base, back, minmax) ** int(expr.exp)
    if isinstance(expr, sympy.floor | sympy.ceiling):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den.free_symbols or not den.is_Integer:
            raise ValueError(f"cannot evaluate {expr}")
        n = _evaluate(sympy.expand(num), back, minmax)
        return n // int(den) if isinstance(expr, sympy.floor) else -((-n) // int(den))
    if isinstance(expr, sympy.Max | sympy.Min):
        pick = minmax[0] if isinstance(expr, sympy.Max) else minmax[1]
        vals = [_evaluate(a, back, minmax) for a in expr.args]
        result = vals[0]
        for v in vals[1:]:
            result = pick(result, v)
        return result
    raise ValueError(f"cannot evaluate {expr}")


def dynamic_settings(program: ast.Program, dynamic, settings: Mapping | None, what: str) -> dict:
    """``settings`` for an op whose input sizes vary (``dynamic``: True, or the names of the
    dimensions that vary): the ``generic`` setting on, so that a compiler builds one kernel per
    bucket of shapes (``backends.llvm.generic``) instead of one per shape. Named dimensions must be
    dimensions of the inputs (which integers vary is found from the shapes seen; the names say
    what the caller expects and are checked)."""
    out = dict(settings or {})
    if not dynamic:
        return out
    if dynamic is not True:
        names = [dynamic] if isinstance(dynamic, str) else list(dynamic)
        dims = {d for i in program.inputs for d in (i.dims or ())}
        unknown = [n for n in names if n not in dims]
        if unknown or not names:
            raise TileInputError(
                f"{what}: dynamic names {unknown or 'no dimension'}, not a dimension of its inputs",
                None,
                hint=f"name dimensions of the inputs ({', '.join(sorted(dims)) or 'none'}), or pass True",
            )
    out["generic"] = True
    return out
