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
from collections.abc import Mapping

import numpy as np

from backends.lane import Lane


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
        return cls(lane, feeds, names, keep)

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The outputs by Tile name, or None where this call must take the general path."""
        pointers = self.template.copy()
        seen = set()
        for k, onnx_name, dtype, shape in self.given:
            arr = arrays.get(onnx_name)
            if (
                type(arr) is not np.ndarray or arr.dtype != dtype or arr.shape != shape
                or not arr.flags.c_contiguous or not arr.flags.aligned
            ):
                return None
            at = pointers[k] = _address(arr)
            if at in seen or at in self.fixed:
                return None  # (the kernels' buffers are distinct: noalias)
            seen.add(at)
        outs = [make(shape, dtype) for make, shape, dtype in self.outputs]
        if not self.lane(pointers, [_address(o) for o in outs]):
            return None
        return dict(zip(self.names, outs))


def _address(arr: np.ndarray) -> int:
    """The data address of a C-contiguous array: through the buffer protocol (a third of
    ``__array_interface__``'s 2 us, which builds a dict), or for a read-only or empty array
    through the interface."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError):
        return arr.__array_interface__["data"][0]


__all__ = ["OnnxLane"]
