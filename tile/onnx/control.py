"""Control flow with static structure: ``If`` on a condition known at import time, and ``Scan`` /
``Loop`` unrolled over their (static) trip counts.

A Tile program is one straight-line function, so each construct becomes the ONNX nodes it
stands for, renamed apart per branch or iteration (``functions._node``), and is converted like
any other node through ``convert``. Slicing a scan input is a ``Gather`` at a constant index;
stacking scan outputs is ``Unsqueeze`` + ``Concat``. A run-time condition, or a loop that could
stop early on a computed condition, is value-dependent or refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from tile.onnx.errors import TileOnnxUnsupported, TileOnnxValueDependent
from tile.onnx.functions import _node

_COUNT = itertools.count()
MAX_TRIPS = 4096


def _graph(node, name: str):
    return next(a.g for a in node.attribute if a.name == name)


def _known(node, values: dict, i: int, what: str):
    v = values[node.input[i]]
    if v.const is None:
        raise TileOnnxValueDependent(
            f"{node.op_type} node '{node.name}' (output '{node.output[0]}'): {what} depends on the value of "
            f"'{node.input[i]}', known only at run time", tuple(sorted(v.sources)) or (node.input[i],),
            hint="make it a constant (the backend does so with the value it is given)")
    return np.asarray(v.const)


def _body(graph, bound: dict[str, str], prefix: str, values: dict) -> list:
    """The body's nodes with its inputs bound to ``bound``'s names and its own names prefixed; its
    initializers become constants."""
    from onnx import numpy_helper

    from tile.dtypes import DType
    from tile.onnx.context import Value

    inner = {o for n in graph.node for o in n.output if o} | {i.name for i in graph.initializer}
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        values[prefix + init.name] = Value(None, array.shape, DType.of(array.dtype), array)

    def rename(n: str) -> str:
        return bound.get(n, prefix + n if n in inner else n)

    return [_node(n, rename, {}) for n in graph.node], rename


def if_branch(node, values: dict, convert: Callable) -> None:
    from onnx import helper

    cond = _known(node, values, 0, "the branch taken")
    graph = _graph(node, "then_branch" if bool(cond.ravel()[0]) else "else_branch")
    nodes, rename = _body(graph, {}, f"If{next(_COUNT)}__", values)
    for n in nodes:
        convert(n)
    for k, o in enumerate(graph.output):
        if k < len(node.output) and node.output[k]:
            convert(helper.make_node("Identity", [rename(o.name)], [node.output[k]]))


def _index(t: int, prefix: str, convert: Callable) -> str:
    from onnx import helper, numpy_helper

    name = f"{prefix}t{t}"
    convert(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(t, np.int64))))
    return name


def _stack(parts: list[str], axis: int, out: str, prefix: str, convert: Callable) -> None:
    from onnx import helper

    if not parts:
        raise TileOnnxUnsupported(f"a loop with no iterations has no scan output '{out}' shape")
    lifted = []
    for k, p in enumerate(parts):
        lifted.append(f"{prefix}{out}_u{k}")
        convert(helper.make_node("Unsqueeze", [p], [lifted[-1]], axes=[axis]))
    convert(helper.make_node("Concat", lifted, [out], axis=axis))


def scan(node, values: dict, convert: Callable, opset: int) -> None:
    from onnx import helper

    if opset < 9:
        raise TileOnnxUnsupported(f"Scan node '{node.name}': the opset-8 form (batched, sequence_lens)")
    graph = _graph(node, "body")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "body"}
    m = attrs["num_scan_inputs"]
    n = len(node.input) - m
    k_out = len(graph.output) - n
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    out_axes = list(attrs.get("scan_output_axes", [0] * k_out))
    out_dirs = list(attrs.get("scan_output_directions", [0] * k_out))
    scanned = [values[node.input[n + j]] for j in range(m)]
    in_axes = [a % v.rank for a, v in zip(in_axes, scanned)]
    trips = scanned[0].shape[in_axes[0]]
    prefix = f"Scan{next(_COUNT)}__"
    states = list(node.input[:n])
    collected: list[list[str]] = [[] for _ in range(k_out)]
    for t in range(trips):
        bound = dict(zip([i.name for i in graph.input[:n]], states))
        for j in range(m):
            at = trips - 1 - t if in_dirs[j] else t
            piece = f"{prefix}in{j}_{t}"
            convert(helper.make_node("Gather", [node.input[n + j], _index(at, prefix, convert)], [piece],
                                     axis=in_axes[j]))
            bound[graph.input[n + j].name] = piece
        nodes, rename = _body(graph, bound, f"{prefix}{t}_", values)
        for x in nodes:
            convert(x)
        states = [rename(o.name) for o in graph.output[:n]]
        for k in range(k_out):
            collected[k].append(rename(graph.output[n + k].name))
    for i, s in enumerate(states):
        if i < len(node.output) and node.output[i]:
            convert(helper.make_node("Identity", [s], [node.output[i]]))
    for k in range(k_out):
        out = node.output[n + k] if n + k < len(node.output) else ""
        if out:
            parts = collected[k][::-1] if out_dirs[k] else collected[k]
            rank = values[parts[0]].rank if parts else 0
            _stack(parts, out_axes[k] % (rank + 1), out, prefix, convert)


def loop(node, values: dict, convert: Callable) -> None:
    """``Loop`` with a constant trip count (or a constant ``true`` condition the body keeps or
    sets to a value known at import time): unrolled; a computed stop condition is refused."""
    from onnx import helper, numpy_helper

    graph = _graph(node, "body")
    trips = int(_known(node, values, 0, "the trip count").ravel()[0]) if node.input[0] else None
    go = bool(_known(node, values, 1, "the loop condition").ravel()[0]) if len(node.input) > 1 and \
        node.input[1] else True
    n = len(node.input) - 2
    k_out = len(graph.output) - 1 - n
    prefix = f"Loop{next(_COUNT)}__"
    states = list(node.input[2:])
    collected: list[list[str]] = [[] for _ in range(k_out)]
    cond = node.input[1] if len(node.input) > 1 else ""
    t = 0
    while go and (trips is None or t < trips):
        if t >= MAX_TRIPS:
            raise TileOnnxUnsupported(f"Loop node '{node.name}' runs more than {MAX_TRIPS} iterations")
        bound = dict(zip([i.name for i in graph.input[2:]], states))
        bound[graph.input[0].name] = _index(t, prefix, convert)
        if len(graph.input) > 1:
            if not cond:
                cond = f"{prefix}true"
                true = numpy_helper.from_array(np.array(True))
                convert(helper.make_node("Constant", [], [cond], value=true))
            bound[graph.input[1].name] = cond
        nodes, rename = _body(graph, bound, f"{prefix}{t}_", values)
        for x in nodes:
            convert(x)
        cond = rename(graph.output[0].name)
        v = values[cond]
        if v.const is None:
            raise TileOnnxUnsupported(f"Loop node '{node.name}': its condition is computed at run time, so "
                                      "the number of iterations is not static")
        go = bool(np.asarray(v.const).ravel()[0])
        states = [rename(o.name) for o in graph.output[1:1 + n]]
        for k in range(k_out):
            collected[k].append(rename(graph.output[1 + n + k].name))
        t += 1
    for i, s in enumerate(states):
        if i < len(node.output) and node.output[i]:
            convert(helper.make_node("Identity", [s], [node.output[i]]))
    for k in range(k_out):
        out = node.output[n + k] if n + k < len(node.output) else ""
        if out:
            _stack(collected[k], 0, out, prefix, convert)
