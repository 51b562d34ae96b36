"""The fast lane of an imported model's calls (``BackendRep.run``) on ``llvm_cpu.N``.

A model is called again and again with inputs of one signature, numpy in and numpy out. The
general path (``CompiledProgram.run``) checks every input, picks buffers, chains events between
kernels and hands outputs back: about 10 us a kernel, as much as the kernels themselves for the
exported MLP and CNN and half of the transformer's call (bench/RESULTS.md, "ONNX speed, fourth
session"). After a general call has compiled and run the program for a signature, an ``OnnxLane``
runs its kernels on raw addresses instead (``backends.lane.Lane``): the model's inputs where numpy
holds them, the constants (initializers) where the import keeps them, outputs from ``np.empty``
(``np.zeros`` where the program needs them zeroed). The results are the general path's: the same
kernels on the same values.

A call takes the general path instead where an input is not C-contiguous, not aligned or not of the
program's dtype, two inputs share memory, or the device has general work queued; ``TILE_DEBUG``
turns the lane off (it reports the general path's work). Devices whose executors do not launch on
raw addresses have no lane.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence

import numpy as np

from backends.lane import Lane, debug_on
from tile.onnx.arena import arena


class OnnxLane:
    """A ``Lane`` over one compiled program of an imported model: per Tile input, the ONNX input
    it comes from (or the constant's fixed address); the outputs' numpy types."""

    __slots__ = ("lane", "feeds", "outputs", "names", "keep", "template", "given", "fixed")

    def __init__(self, lane: Lane, feeds: list, names: list[str], keep: list[np.ndarray]):
        self.lane = lane
        self.feeds = feeds  # per Tile input: (ONNX name, numpy dtype, shape) or a constant's address
        self.names = names  # the program's outputs, in the lane's order
        self.outputs = [(np.zeros if zero else np.empty, shape, dtype.numpy)
                        for (shape, dtype), zero in zip(lane.output_types, lane.zeroed_outputs)]
        self.keep = keep  # the constants whose memory the lane reads
        # a call fills in only the given inputs' addresses (``template``'s None places)
        self.template = [f if isinstance(f, int) else None for f in feeds]
        self.given = [(k, *f) for k, f in enumerate(feeds) if not isinstance(f, int)]
        self.fixed = frozenset(f for f in feeds if isinstance(f, int))

    @classmethod
    def of(cls, program, imp) -> OnnxLane | None:
        """The lane of ``program`` (the ``CompiledProgram`` a general call of the imported model
        ``imp`` just ran), or None: a device without raw launches, carried types (converted at the
        edges), a constant that is not a C-contiguous array of the program's dtype."""
        if imp.carried or program is None or not hasattr(program, "buffers"):
            return None
        if not getattr(program.device.executor, "host_memory", False):
            return None  # (numpy's addresses are host memory)
        by_tile = {t: o for o, t in imp.inputs}
        feeds, keep = [], []
        for name in program.inputs:
            shape = program.buffers[name]
            want = shape.dtype.numpy
            if name in by_tile:
                feeds.append((by_tile[name], want, tuple(shape.sizes)))
                continue
            value = imp.constants.get(name)
            if not isinstance(value, np.ndarray) or value.dtype != want or not value.flags.c_contiguous:
                return None
            keep.append(value)
            feeds.append(value.__array_interface__["data"][0])
        if len({f for f in feeds if isinstance(f, int)}) != len(keep):
            return None  # (one constant's memory behind two inputs: the kernels' buffers are noalias)
        names = list(program.outputs)
        lane = Lane.of(program, list(program.inputs), names)
        if lane is None:
            return None
        placed = arena(keep)  # the constants in huge pages (``arena``), which the imported model
        if placed is not None:  # then holds instead of the originals (the same values)
            for name, copy in zip([n for n in program.inputs if n not in by_tile], placed, strict=True):
                imp.constants[name] = copy
            copies = iter(placed)
            feeds = [next(copies).__array_interface__["data"][0] if isinstance(f, int) else f for f in feeds]
            keep = placed
        return cls(lane, feeds, names, keep)

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The outputs by Tile name, or None where this call must take the general path."""
        outs = self.launch([arrays.get(onnx_name) for _, onnx_name, _, _ in self.given])
        return None if outs is None else dict(zip(self.names, outs))

    def launch(self, given: Sequence) -> list[np.ndarray] | None:
        """The outputs in the lane's order (``names``) for the arrays of ``given`` (one per entry of
        ``self.given``, in its order), or None where this call must take the general path."""
        pointers = self.template.copy()
        seen = set()
        for (k, _, dtype, shape), arr in zip(self.given, given):
            if type(arr) is not np.ndarray or arr.dtype != dtype or arr.shape != shape:
                return None
            flags = arr.flags
            if not (flags.c_contiguous and flags.aligned):
                return None
            at = pointers[k] = _address(arr)
            if at in seen or at in self.fixed:
                return None  # (the kernels' buffers are distinct: noalias)
            seen.add(at)
        outs = [make(shape, dtype) for make, shape, dtype in self.outputs]
        if not self.lane(pointers, [_address(o) for o in outs]):
            return None
        return outs


class PositionalCall:
    """``BackendRep.run``'s shortcut for the calls of one input signature given as a list: the
    ONNX inputs by position, each of the recorded shape and dtype, run on the lane (``launch``)
    with no key built, no dict of inputs, no dict of outputs; None (the general path) for any
    other call (another signature, a mapping, a non-array, ``TILE_DEBUG``). The outputs are the
    lane's arrays, in the model's output order."""

    __slots__ = ("lane", "count", "signature", "feeds", "order", "cls")

    def __init__(self, lane: OnnxLane, names: Sequence[str], arrays: Sequence[np.ndarray],
                 outputs: Sequence[str], cls):
        self.lane = lane
        self.count = len(arrays)
        self.signature = [(a.shape, a.dtype) for a in arrays]
        position = {n: j for j, n in enumerate(names[: len(arrays)])}
        self.feeds = [(k, position[onnx_name]) for k, onnx_name, _, _ in lane.given]  # (place, input)
        self.order = [lane.names.index(t) for t in outputs]
        self.cls = cls

    @classmethod
    def of(cls, lane: OnnxLane | None, names: Sequence[str], inputs, tile_outputs: Sequence[str],
           out_cls) -> PositionalCall | None:
        """The shortcut for calls like ``inputs`` (a list or tuple of arrays, one per ONNX input
        ``names`` in order), or None: no lane, inputs given otherwise, a lane input no position
        gives."""
        if lane is None or type(inputs) not in (list, tuple) or len(inputs) > len(names):
            return None
        if any(type(a) is not np.ndarray for a in inputs):
            return None
        given = set(names[: len(inputs)])
        if any(onnx_name not in given for _, onnx_name, _, _ in lane.given):
            return None
        if any(t not in lane.names for t in tile_outputs):
            return None
        return cls(lane, names, inputs, tile_outputs, out_cls)

    def __call__(self, inputs) -> tuple | None:
        """``OnnxLane.launch``'s work with the signature checked once for all (each position's
        type, shape and dtype), then its layout and aliasing checks, in one function: ~1 us of
        Python a call less than through ``launch`` (3.4 against 4.3 us, a one-Relu model)."""
        if type(inputs) not in (list, tuple) or len(inputs) != self.count or debug_on():
            return None
        for arr, (shape, dtype) in zip(inputs, self.signature):
            if type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dtype:
                return None
        lane = self.lane
        pointers, fixed, seen = lane.template.copy(), lane.fixed, set()
        for k, j in self.feeds:
            arr = inputs[j]
            flags = arr.flags
            if not (flags.c_contiguous and flags.aligned):
                return None
            at = pointers[k] = _address(arr)
            if at in seen or at in fixed:
                return None  # (the kernels' buffers are distinct: noalias)
            seen.add(at)
        outs = [make(shape, dtype) for make, shape, dtype in lane.outputs]
        if not lane.lane.run((*pointers, *[_address(o) for o in outs])):
            return None
        return self.cls(*[outs[j] for j in self.order])


def _address(arr: np.ndarray) -> int:
    """The data address of a C-contiguous array: through the buffer protocol (a third of
    ``__array_interface__``'s 2 us, which builds a dict), or for a read-only or empty array
    through the interface."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError):
        return arr.__array_interface__["data"][0]


__all__ = ["OnnxLane", "PositionalCall"]
