"""The importer core: an ONNX graph, walked in order, becomes one Tile function.

Graph inputs become the function's inputs; initializers are constants (kept as values, so shape
arguments such as Reshape's are static, and fed as extra inputs where a tensor uses them). A node
whose inputs are all constants is folded: its converted statements run on the interpreter at
import time, so shape arithmetic (Shape -> Gather -> Concat -> Reshape) ends in static values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tile.dtypes import DType
from tile.errors import TileError
from tile.onnx import carried, control, functions
from tile.onnx.context import Builder, Context, Value, cast_text
from tile.onnx.errors import TileOnnxError, TileOnnxUnsupported
from tile.onnx.registry import CONVERTERS
from tile.typed import TensorType

# ONNX TensorProto.DataType -> Tile dtype (the types Tile has)
ONNX_DTYPES = {
    1: DType.FLOAT32, 2: DType.UINT8, 3: DType.INT8, 4: DType.UINT16, 5: DType.INT16, 6: DType.INT32,
    7: DType.INT64, 9: DType.BOOL, 10: DType.FLOAT16, 11: DType.FLOAT64, 12: DType.UINT32,
    13: DType.UINT64, 16: DType.BFLOAT16,
}
# operators never folded: their values are not a function of their inputs
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
           "Bernoulli", "Dropout"}
# the operators that take a value of a type Tile lacks (tile.onnx.carried): these convert it, and
# Identity passes it on; any other would compute on the carrier's numbers without rounding
TAKE_CARRIED = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Identity"}
FOLD_LIMIT = 1 << 16  # elements: larger constant results stay computed at run time


@dataclass
class Imported:
    """A converted model: the Tile ``source``; ``inputs``/``outputs`` as (ONNX name, Tile name) in
    graph order; ``constants`` (Tile name -> array) to feed beside the inputs; ``initializers``
    (Tile name -> ONNX initializer name) for the constants that are the model's initializers."""

    source: str
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    constants: dict[str, np.ndarray]
    initializers: dict[str, str] = field(default_factory=dict)
    input_types: dict[str, tuple[tuple[int, ...], DType]] = field(default_factory=dict)  # by Tile name
    narrow: bool = False  # some tensor is float16 or bfloat16
    carried: dict[str, str] = field(default_factory=dict)  # Tile name -> ONNX type Tile lacks (I/O)

    def feeds(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The Tile program's inputs from the model's inputs (by ONNX name) and the constants."""
        out = {t: np.asarray(arrays[o]) for o, t in self.inputs}
        for t, name in self.carried.items():
            if t in out:
                out[t] = carried.to_carrier(out[t], carried.BY_NAME[name])
        out.update(self.constants)
        return out


def load(model):
    """A ModelProto from a ModelProto, a path or serialized bytes."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        try:
            return onnx.load(os.fspath(model))
        except (OSError, ValueError) as e:
            raise TileOnnxError(f"cannot read the ONNX model '{os.fspath(model)}': {e}", None,
                                "give the path of a .onnx file") from e
    raise TileOnnxError(f"expected an onnx.ModelProto, a path or bytes, not {type(model).__name__}")


def to_tile(model, shapes: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """The Tile program (one function) of an ONNX model. ``shapes`` gives the sizes of inputs whose
    declared shapes have symbolic dimensions."""
    return import_model(model, shapes).source


def onnx_dtype(elem_type: int, what: str) -> DType:
    try:
        return ONNX_DTYPES[elem_type]
    except KeyError:
        import onnx

        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise TileOnnxUnsupported(f"{what} has the ONNX type {name}, which Tile does not have", None,
                                  "Tile has bool, (u)int8..64, float16/32/64 and bfloat16") from None


def tensor_type(elem_type: int, what: str) -> tuple[DType, carried.Format | None]:
    """The Tile dtype holding ONNX element type ``elem_type``, and the ONNX type it carries where
    Tile lacks it (float8, float4, 4- and 2-bit integers: ``tile.onnx.carried``)."""
    fmt = carried.FORMATS.get(elem_type)
    if fmt is not None:
        return fmt.carrier, fmt
    return onnx_dtype(elem_type, what), None


def _declared(vi, shapes: Mapping) -> tuple[tuple[int, ...], DType, carried.Format | None]:
    kind = vi.type.WhichOneof("value")
    if kind == "optional_type" and vi.type.optional_type.elem_type.HasField("tensor_type"):
        t = vi.type.optional_type.elem_type.tensor_type  # an optional tensor that is given
    elif kind in ("tensor_type", None):
        t = vi.type.tensor_type
    else:
        raise TileOnnxUnsupported(f"input '{vi.name}' is a {kind.replace('_type', '')}, which Tile does "
                                  "not have", None, "Tile programs take tensors only")
    dtype, fmt = tensor_type(t.elem_type, f"input '{vi.name}'")
    if vi.name in shapes:
        return tuple(int(d) for d in shapes[vi.name]), dtype, fmt
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            raise TileOnnxError(
                f"input '{vi.name}' has a symbolic dimension '{d.dim_param or '?'}'", None,
                f"give its shape: to_tile(model, shapes={{'{vi.name}': (...)}}), or run it through the "
                "backend")
        dims.append(int(d.dim_value))
    return tuple(dims), dtype, fmt


def import_model(model, shapes: Mapping[str, tuple[int, ...]] | None = None,
                 fixed: Mapping[str, np.ndarray] | None = None, params: bool = False,
                 pack: bool = False) -> Imported:
    """Convert ``model``. ``shapes``: sizes of inputs (overriding the declared ones); ``fixed``:
    values of graph inputs to treat as constants (the backend passes those a shape depends on);
    ``params``: keep float initializers out of constant folding, so each is an input of the
    program that gradients can be taken with respect to (``tile.onnx.training``); ``pack``: lay
    constants out for speed where a converter knows a better layout (a Gemm's constant ``B`` with
    ``transB`` is stored transposed, K-major, so the product reads it along its rows); a constant so
    laid out is no longer the model's initializer and ``Imported.initializers`` leaves it out. The
    backend packs; ``params`` does not."""
    from onnx import numpy_helper

    model = load(model)
    graph = model.graph
    shapes = dict(shapes or {})
    fixed = dict(fixed or {})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    b = Builder()
    b.pack = pack and not params
    values: dict[str, Value] = {}
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        dtype, fmt = tensor_type(init.data_type, f"initializer '{init.name}'")
        values[init.name] = Value(None, tuple(array.shape), dtype, array.astype(dtype.numpy),
                                  carried=fmt and fmt.name)
    for init in graph.sparse_initializer:
        raise TileOnnxUnsupported(f"sparse initializer '{init.values.name}' is not supported")
    inputs = []
    exotic: dict[str, str] = {}  # Tile name -> the ONNX type it carries, of inputs and outputs
    for vi in graph.input:
        if vi.name in values:
            continue  # an initializer also listed as an input (older exporters): a constant
        shape, dtype, fmt = _declared(vi, shapes)
        if vi.name in fixed:
            array = np.asarray(fixed[vi.name]).astype(dtype.numpy)
            values[vi.name] = Value(None, tuple(array.shape), dtype, array, carried=fmt and fmt.name)
            continue
        name = b.fresh(vi.name)
        b.types[name] = TensorType(dtype, shape)
        values[vi.name] = Value(name, shape, dtype, sources=frozenset([vi.name]), carried=fmt and fmt.name)
        inputs.append((vi.name, name))
        if fmt is not None:
            exotic[name] = fmt.name
    initializers: dict[str, str] = {}
    local = {(f.domain, f.name): f for f in model.functions}
    keep = {i.name for i in graph.initializer if params and values[i.name].dtype.is_float}
    for node in graph.node:
        _convert(b, node, values, opset, initializers, local, keep)
    outputs = _outputs(b, graph, values, {t for _, t in inputs}, exotic)
    source = b.text([t for _, t in inputs] + list(b.consts), [t for _, t in outputs])
    return Imported(source, inputs, outputs, dict(b.consts),
                    {t: o for t, o in initializers.items()
                     if t in b.consts and o in {i.name for i in graph.initializer}},
                    {t: (tuple(b.types[t].shape), b.types[t].dtype) for _, t in inputs},
                    any(t.dtype.is_narrow_float for t in b.types.values()), exotic)


def _convert(b: Builder, node, values: dict, opset: int, initializers: dict, local: dict,
             keep: set[str]) -> None:
    for n in node.input:
        if n and n not in values:
            raise TileOnnxError(f"{node.op_type} node '{node.name}' reads '{n}', which nothing defines "
                                "before it")
    fn = CONVERTERS.get(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}")
    if node.op_type in ("If", "Scan", "Loop") and fn is None:
        def convert(n):
            _convert(b, n, values, opset, initializers, local, keep)

        if node.op_type == "If":
            control.if_branch(node, values, convert)
        elif node.op_type == "Scan":
            control.scan(node, values, convert, opset)
        else:
            control.loop(node, values, convert)
        return
    if fn is None:
        expanded = functions.body(node, opset, [_type_proto(values.get(n)) for n in node.input], local)
        if expanded is not None:
            nodes, inner = expanded
            for n in nodes:
                _convert(b, n, values, inner, initializers, local, keep)
            return
        where = f" in domain '{node.domain}'" if node.domain not in ("", "ai.onnx") else ""
        raise TileOnnxUnsupported(f"no converter for the ONNX operator {node.op_type}{where} (node "
                                  f"'{node.name}'), and ONNX defines it as no function of others", None,
                                  "tile.onnx.registry.supported() lists the operators it converts")
    given = [values[n] for n in node.input if n]
    held = next((v.carried for v in given if v.carried), None)
    if held is not None and node.op_type not in TAKE_CARRIED:
        raise TileOnnxUnsupported(
            f"{node.op_type} node '{node.name}' takes a {held} tensor: Tile has no {held}, and carries it "
            f"in {carried.BY_NAME[held].carrier} for {', '.join(sorted(TAKE_CARRIED))} only", None,
            f"Cast the {held} tensor to a Tile type first")
    outs = None
    if (node.op_type not in NO_FOLD and held is None and not _makes_carried(node)
            and all(v.const is not None for v in given) and not keep & set(node.input)
            and sum(v.size for v in given) <= FOLD_LIMIT):
        outs = _fold(fn, node, values, opset)
    if outs is None:
        before = dict(values)
        ctx = Context(b, node, values, opset)
        outs = _run(fn, ctx, node)
        for name, v in values.items():  # constants materialized here: remember the initializers'
            if before.get(name) is not v and v.name is not None and before.get(name) is not None:
                initializers[v.name] = name
    if len(outs) < len([o for o in node.output if o]):
        raise TileOnnxUnsupported(f"{node.op_type} node '{node.name}': only the first {len(outs)} outputs "
                                  "are supported")
    sources = frozenset().union(*(v.sources for v in given))
    for name, v in zip(node.output, outs):
        if name:
            if v is not None and sources:
                v = dataclasses.replace(v, sources=sources)
            if v is None:
                raise TileOnnxUnsupported(f"{node.op_type} node '{node.name}': output '{name}' is not "
                                          "supported")
            if node.op_type == "Identity" and held is not None:
                v = dataclasses.replace(v, carried=held)
            values[name] = v


def _makes_carried(node) -> bool:
    """Whether ``node`` writes a type Tile lacks (its converter then rounds to it; never folded, so
    that the carried type is not lost in a constant)."""
    return any(a.name in ("to", "output_dtype") and a.i in carried.FORMATS for a in node.attribute)


def _type_proto(v: Value | None):
    from onnx import TypeProto, helper

    if v is None:
        return TypeProto()
    elem = carried.BY_NAME[v.carried].elem if v.carried else next(k for k, d in ONNX_DTYPES.items()
                                                                  if d is v.dtype)
    return helper.make_tensor_type_proto(elem, v.shape)


def _run(fn, ctx: Context, node) -> list:
    try:
        return list(fn(ctx, node))
    except TileError:
        raise
    except Exception as e:  # a converter's bug: say which node, keep the cause
        raise TileOnnxError(f"{ctx.where}: the converter failed: {type(e).__name__}: {e}", None,
                            "this is a bug in tile.onnx; please report it with the model") from e


def _fold(fn, node, values: dict, opset: int) -> list | None:
    """The node's outputs computed now on the interpreter (all its inputs are constants), or
    ``None`` when that fails or a result is large: then it is converted as usual."""
    import tile

    b = Builder()
    local, feeds = {}, {}
    for n in node.input:
        if n and n not in local:
            v = values[n]
            t = b.fresh(n)
            b.types[t] = TensorType(v.dtype, v.shape)
            feeds[t] = v.const
            local[n] = Value(t, v.shape, v.dtype, v.const)
    try:
        outs = list(fn(Context(b, node, local, opset), node))
        ready, names = [], []
        for v in outs:
            if v is None or v.const is not None:  # (a name of the scratch program is dropped)
                ready.append(v if v is None else Value(None, v.shape, v.dtype, v.const))
                continue
            if v.size > FOLD_LIMIT:
                return None
            out = b.fresh("Out")
            b.add([f"{out} = {v.name}"])
            names.append(out)
            ready.append(out)
        if names:
            src = b.text(list(feeds) + list(b.consts), names)
            results = tile.compile(src, "interp")({**feeds, **b.consts})
        return [r if not isinstance(r, str) else
                Value(None, tuple(np.shape(results[r])), b.types[r].dtype,
                      np.asarray(results[r]).astype(b.types[r].dtype.numpy)) for r in ready]
    except (TileError, ArithmeticError, ValueError, TypeError, IndexError, KeyError):
        return None


def _outputs(b: Builder, graph, values: dict, inputs: set[str],
             exotic: dict[str, str]) -> list[tuple[str, str]]:
    outputs, used = [], set()
    for vi in graph.output:
        if vi.name not in values:
            raise TileOnnxError(f"graph output '{vi.name}' is computed by no node")
        v = values[vi.name]
        t = vi.type.tensor_type
        want, fmt = tensor_type(t.elem_type, f"output '{vi.name}'") if t.elem_type else (v.dtype, None)
        if fmt is None and v.carried and not t.elem_type:
            fmt = carried.BY_NAME[v.carried]
        if (fmt and fmt.name) != v.carried:
            raise TileOnnxError(f"graph output '{vi.name}' is declared {fmt.name if fmt else want}, but is "
                                f"computed as {v.carried or v.dtype}", None,
                                "declare the output's type as the node that computes it defines it")
        v = b.materialize(v, vi.name)
        if v.name in inputs or v.name in b.consts or v.name in used or v.dtype is not want:
            name = b.fresh(vi.name)
            b.add([f"{name} = {cast_text(v.name, want) if v.dtype is not want else v.name}"])
            v = b.value(name)
        used.add(v.name)
        outputs.append((vi.name, v.name))
        if fmt is not None:
            exotic[v.name] = fmt.name
    return outputs
