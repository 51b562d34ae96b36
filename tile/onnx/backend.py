"""``tile.onnx.Backend``: the ONNX backend API (``onnx.backend.base``) over ``tile.compile``.

Devices: ``"CPU"`` runs on ``llvm_cpu.0`` and ``"CUDA"`` on ``opencl_gpu.0``; any other string is a
Tile target id (``interp``, a plugin's id, ``external:COMMAND``), and ``TILE_ONNX_TARGET`` overrides
the target of ``"CPU"``/``"CUDA"`` (so the standard runner can test any target)::

    import onnx.backend.test, tile.onnx
    globals().update(onnx.backend.test.BackendTest(tile.onnx.Backend, __name__).test_cases)

A model is imported again for each new set of input shapes and dtypes. A model with float16 or
bfloat16 tensors compiles with ``strict`` (unless ``settings=`` says otherwise): their matrix
products are summed in float32, as the interpreter and ONNX's reference do. Inputs a shape depends on
(Reshape's ``shape`` given as a graph input, ...) are fixed to the values of the call, so such a
model is compiled once per distinct value of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
from onnx.backend.base import Backend as _Backend
from onnx.backend.base import BackendRep as _BackendRep
from onnx.backend.base import namedtupledict

import tile
from tile.onnx import carried
from tile.onnx.errors import TileOnnxValueDependent
from tile.onnx.importer import Imported, import_model, load
from tile.onnx.lane import OnnxLane, PositionalCall, debug_on

NAMED = {"CPU": "llvm_cpu.0", "CUDA": "opencl_gpu.0"}
_PROBE = "function (A) -> (B) { B = A; }"


def target(device: str = "CPU") -> str:
    """The Tile target id for an ONNX device string (see the module docstring)."""
    kind = device.split(":")[0].upper()
    if kind in NAMED:
        return os.environ.get("TILE_ONNX_TARGET") or NAMED[kind]
    return device


class BackendRep(_BackendRep):
    """A prepared model: imported (per input shapes, and per value of the inputs shapes depend
    on) and compiled for one Tile target."""

    def __init__(self, model, device: str = "CPU", settings: Mapping | None = None):
        self.model = load(model)
        self.target = target(device)
        self.settings = dict(settings or {})
        self.input_names = [vi.name for vi in self.model.graph.input
                            if vi.name not in {i.name for i in self.model.graph.initializer}]
        self.fixed: set[str] = set()  # graph inputs whose values decide a shape
        self._cache: dict[tuple, tuple[Imported, tile.Executable]] = {}
        self._outputs: dict[tuple[str, ...], type] = {}
        self._lanes: dict[tuple, OnnxLane | None] = {}  # per key of ``_cache``: the fast lane
        self._key: tuple = ()  # the key of the last ``imported``
        self._positional: PositionalCall | None = None  # ``run``'s shortcut for the last signature

    def _named(self, inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            return {k: np.asarray(v) for k, v in inputs.items()}
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
            inputs = [inputs]
        return {n: np.asarray(v) for n, v in zip(self.input_names, inputs)}

    def imported(self, arrays: Mapping[str, np.ndarray]) -> tuple[Imported, tile.Executable]:
        """The imported model and its executable for these inputs."""
        while True:
            key = tuple((n, a.shape, a.dtype.str, a.tobytes() if n in self.fixed else b"")
                        for n, a in sorted(arrays.items()))
            self._key = key
            if key in self._cache:
                return self._cache[key]
            try:
                imp = import_model(self.model, {n: a.shape for n, a in arrays.items()},
                                   {n: arrays[n] for n in self.fixed if n in arrays}, pack=True)
            except TileOnnxValueDependent as e:
                new = set(e.names) & (set(arrays) - self.fixed)
                if not new:
                    raise
                self.fixed |= new
                self._positional = None  # (keys hold these inputs' values from now on)
                continue
            settings = dict(self.settings)
            if imp.narrow and self.target != "interp":
                # float16/bfloat16 products summed in float32, in the interpreter's order (§8.3),
                # as ONNX's reference (numpy) computes them
                settings.setdefault("strict", True)
            exe = tile.compile(imp.source, self.target, settings)
            self._cache[key] = (imp, exe)
            return imp, exe

    def run_named(self, inputs) -> dict[str, np.ndarray]:
        """The outputs by ONNX name, in graph order."""
        arrays = self._named(inputs)
        imp, exe = self.imported(arrays)
        key, debug = self._key, debug_on()
        lane = None if debug else self._lanes.get(key)
        results = lane(arrays) if lane is not None else None  # (``tile.onnx.lane``)
        if results is None:
            results = exe(imp.feeds(arrays))
            if key not in self._lanes and not debug and self.target != "interp":
                self._lanes[key] = OnnxLane.of(getattr(exe, "_last", None), imp)
        return {o: _onnx_array(results[t], imp.carried.get(t), o) for o, t in imp.outputs}

    def run(self, inputs, **kwargs) -> tuple:
        fast = self._positional
        if fast is not None:  # the last signature's calls on the lane (``PositionalCall``)
            out = fast(inputs)
            if out is not None:
                return out
        named = self.run_named(inputs)
        names = tuple(named)
        cls = self._outputs.get(names)
        if cls is None:  # onnx's namedtupledict builds a class (through eval): once per output names
            cls = self._outputs[names] = namedtupledict("Outputs", list(names))
        if not self.fixed:  # (a key holding input values is checked on the general path)
            imp = self._cache[self._key][0]
            self._positional = PositionalCall.of(self._lanes.get(self._key), self.input_names, inputs,
                                                 [t for _, t in imp.outputs], cls)
        return cls(*named.values())


class Backend(_Backend):
    """The ONNX backend of Tile (see the module docstring for devices and targets)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        """Whether ``model`` imports (checked now where its input shapes are static)."""
        try:
            cls.prepare(model, device)
        except tile.TileError:
            return False
        return True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> BackendRep:
        """Import ``model`` now when its input shapes are static, so an unsupported operator or
        dtype surfaces here (shapes that depend on input values wait for the first run);
        ``settings=`` passes ``tile.compile`` settings."""
        rep = BackendRep(model, device, kwargs.get("settings"))
        initial = {i.name for i in rep.model.graph.initializer}
        dims = [d for vi in rep.model.graph.input if vi.name not in initial
                for d in vi.type.tensor_type.shape.dim]
        if all(d.HasField("dim_value") for d in dims):
            try:
                import_model(rep.model)
            except TileOnnxValueDependent:
                pass
        return rep

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs) -> tuple:
        """Run one ``NodeProto`` on ``inputs`` (a list in the node's input order, or a dict)."""
        from onnx import helper, numpy_helper

        names = [n for n in node.input if n]
        arrays = dict(inputs) if isinstance(inputs, Mapping) else dict(zip(names, inputs))
        graph_in = [helper.make_tensor_value_info(n, _elem(arrays[n]), np.shape(arrays[n])) for n in names]
        graph_out = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        model = helper.make_model(helper.make_graph([node], "run_node", graph_in, graph_out),
                                  opset_imports=[helper.make_opsetid("", kwargs.get("opset_version", 21))])
        del numpy_helper
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            tile.compile(_PROBE, target(device))
        except tile.TileError:
            return False
        return True


def _onnx_array(array, carried_type: str | None, name: str) -> np.ndarray:
    """An output as ONNX types it: a type Tile lacks comes back from the carrier it ran in."""
    if carried_type is None:
        return np.asarray(array)
    return carried.from_carrier(array, carried.BY_NAME[carried_type], f"output '{name}'")


def _elem(array) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.asarray(array).dtype)
