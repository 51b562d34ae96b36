"""``tile.torch.op``: a Tile function as a PyTorch custom operator (``torch.library.custom_op``).

Imported only on use (``import tile`` never imports torch). The operator takes torch tensors in
the function's input order and returns one tensor, or a tuple for several outputs. Its fake
(meta) kernel is Tile's shape and dtype inference; its backward is a second custom operator that
runs Tile's gradient program (``tile.grad``) for exactly the inputs that need a gradient, compiled
for the same device. Both are therefore visible to ``torch.compile`` as single graph nodes.

Where a call runs (docs/frameworks.md):

* CPU tensors run on ``llvm_cpu.0`` without copies: inputs are read in place through numpy views
  of the tensors' memory, outputs are written into memory that the returned tensors then own.
  A non-contiguous input is made contiguous first (one copy, said under ``TILE_DEBUG=1``).
* CUDA tensors run on ``cuda.N`` where that device exists (``tile.torch_cuda.Direct``): in their own
  memory, on torch's current stream, with no copy and no host wait (CUDA graphs capture them).
  Else on ``opencl_gpu.0``, in CUDA memory that OpenCL shares where the device can
  (``cl_khr_external_memory_opaque_fd``, matched to the CUDA device by UUID; ``tile.torch_cuda``):
  inputs are copied device-to-device into shared blocks, the kernels write the outputs into blocks
  the returned tensors view. Otherwise (``TILE_CUDA_SHARING=0``, another driver, a failure) they
  cross through host copies (in, and back out onto the tensors' CUDA device). ``TILE_DEBUG=1``
  prints the path, why sharing was not taken, and the bytes copied.
* ``device=`` names a Tile device for every call instead (e.g. ``"opencl_cpu.0"``); tensors that
  are not on the host cross through it.

A call again at a signature the op has run at goes straight to the kernels on the tensors'
memory (``tile.torch_lane``), an eager one checked and launched by one function
(``tile.torch_hot``), its backward too.

``torch.func.vmap`` runs the op once per batch element (a registered vmap rule). Reverse and
forward mode, ``torch.func`` transforms and derivatives of any order: ``tile.torch_autograd``.
An op pickles as what defines it (source, name, device, settings), so a module holding one can
be deep-copied and ``torch.save``d; ``save``/``load`` keep the sources in a ``torch.export`` file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import torch

from tile.bridge import Op, dynamic_settings
from tile.errors import TileInputError
from tile.parser import parse as tile_parse
from tile.torch_autograd import TileFunction, as_inputs, eager_apply, register_autograd
from tile.torch_dtypes import IN_PLACE as _IN_PLACE
from tile.torch_dtypes import TO_NUMPY as _TO_NUMPY
from tile.torch_dtypes import TO_TORCH as _TO_TORCH
from tile.torch_hot import HotCall
from tile.torch_lane import (
    AUTOGRAD,
    DISPATCH,
    LANES_KEPT,
    PLAIN,
    PLAIN_TYPES,
    TRANSFORM,
    TorchLane,
    learn,
    materialized,
    ordinary,
    signature,
    through_lane,
    watched,
)

__all__ = ["LANES_KEPT", "TorchOp", "load", "op", "save"]

_OPS: dict[str, TorchOp] = {}
_dynamo_compiling = torch.compiler.is_dynamo_compiling  # (False here, True as Dynamo traces: 30 ns)
DEFAULT_DEVICES = {"cpu": "llvm_cpu.0", "cuda": "opencl_gpu.0"}



def _eager_kind(tensors, cuda: bool = False) -> int:
    """How a call runs. ``DISPATCH`` through ``torch.ops.tile`` when anything would see the
    difference: ``torch.compile``, tracing, a torch function or dispatch mode (FakeTensor, FX and
    export tracing, functionalization), a functorch transform (vmap, grad), forward-mode AD, a
    tensor subclass (``nn.Parameter`` is none: ``PLAIN_TYPES``), or a tensor off the CPU
    (``cuda``: off the CPU and CUDA). Otherwise the same work without the dispatcher, 10-40 us
    sooner: ``PLAIN`` (no input needs a gradient, or grad
    mode is off) calls the kernel directly, ``AUTOGRAD`` through ``TileEagerFunction``, the same
    forward and backward as the registered ones.
    ``TRANSFORM``: under a ``torch.func`` transform, ``TileFunction`` applied here, above the
    transforms (``torch.func`` takes an ``autograd.Function`` only there, not from inside a
    dispatcher kernel)."""
    kind = watched()
    if kind:
        return kind
    for t in tensors:
        if type(t) not in PLAIN_TYPES or not (t.is_cpu or cuda and t.is_cuda):
            return DISPATCH
        if t.requires_grad:
            kind = AUTOGRAD
    return AUTOGRAD if kind == AUTOGRAD and torch.is_grad_enabled() else PLAIN


def op(
    source,
    *,
    name: str | None = None,
    device: str | None = None,
    settings: dict | None = None,
    differentiable: bool = True,
    dynamic: bool | str | tuple | list = False,
) -> TorchOp:
    """A PyTorch operator running the Tile function ``source`` (text or a ``tile.Program``).

    ``name`` is its name in ``torch.ops.tile`` (default ``tile_<hash of the source>``); the same
    source, name and device give the same operator back. ``device`` is a Tile device id used for
    every call; by default CPU tensors run on ``llvm_cpu.0`` and CUDA tensors on ``cuda.N`` (else
    ``opencl_gpu.0``).
    ``settings`` are ``tile.compile``'s (e.g. ``{"threads": 1}``). Unknown names and functions in
    the source are refused here, and so is a source whose gradient cannot be derived, unless
    ``differentiable=False`` makes a forward-only op (whose backward is refused). ``dynamic``
    (True, or the names of the input dimensions that vary) builds one kernel per bucket of shapes,
    not per shape (the ``generic`` setting, ``tile.bridge.dynamic_settings``)."""
    text = source if isinstance(source, str) else str(source)
    if dynamic:
        parsed = tile_parse(source) if isinstance(source, str) else source
        settings = dynamic_settings(parsed, dynamic, settings, "tile.torch op")
    found = _OPS.get(name) if name else None
    if found is not None and _same(found, text, device, settings, differentiable):
        return found  # (not parsed and derived again)
    core = Op(source, "tile.torch op", settings, differentiable)
    qualified = name or f"tile_{core.digest}"
    if not qualified.isidentifier():
        raise TileInputError(
            f"tile.torch op name '{qualified}' is not an identifier",
            None,
            hint="use letters, digits and '_' (it becomes torch.ops.tile.<name>)",
        )
    found = _OPS.get(qualified)
    if found is not None:
        if _same(found, text, device, settings, differentiable):
            return found
        raise TileInputError(
            f"a tile.torch op named '{qualified}' exists already, with other source, device or settings",
            None,
            hint="give this one another name= (PyTorch operators cannot be redefined)",
        )
    made = _OPS[qualified] = TorchOp(core, qualified, device)
    return made


def _same(found: TorchOp, text: str, device, settings, differentiable: bool) -> bool:
    core = found.core
    return (core.text, found.device, core.settings, core.has_gradient) == (
        text, device, dict(settings or {}), differentiable
    )


def _rebuilt(source: str, name: str, device: str | None, settings: dict, differentiable: bool) -> TorchOp:
    """An op from what defines it (how a pickled op loads): the registered one where it exists."""
    return op(source, name=name, device=device, settings=settings, differentiable=differentiable)


EXPORT_FILE = "tile_ops.json"  # where save() keeps the Tile ops of a torch.export program


def save(program, f, *, extra_files: dict | None = None) -> None:
    """``torch.export.save`` of ``program`` (an ``ExportedProgram``) with the definition (source,
    name, device, settings) of every ``tile.torch`` op its graphs call, so that ``load`` makes
    them again before PyTorch reads the graph (``torch.export.load`` alone needs them made first)."""
    ops = {}
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            target = getattr(node.target, "_schema", None)
            if target is None or not target.name.startswith("tile::"):
                continue
            name = target.name.split("::", 1)[1]
            found = _OPS.get(name) or _OPS.get(name.removesuffix("_backward"))
            if found is not None:
                ops[found.name] = found
    defs = [
        {"source": o.core.text, "name": o.name, "device": o.device, "settings": o.core.settings,
         "differentiable": o.core.has_gradient}
        for o in ops.values()
    ]
    torch.export.save(program, f, extra_files={**(extra_files or {}), EXPORT_FILE: json.dumps(defs)})


def load(f, *, extra_files: dict | None = None):
    """``torch.export.load`` of a file ``save`` wrote: its Tile ops made again (or found, where
    this process has them) first. ``f``: a path or a seekable binary file."""
    import zipfile

    if hasattr(f, "seek"):
        start = f.tell()
    with zipfile.ZipFile(f) as z:
        names = [n for n in z.namelist() if n.endswith(f"extra/{EXPORT_FILE}")]
        defs = json.loads(z.read(names[0])) if names else []
    if hasattr(f, "seek"):
        f.seek(start)
    for d in defs:
        op(d["source"], name=d["name"], device=d["device"], settings=d["settings"],
           differentiable=d["differentiable"])
    return torch.export.load(f, extra_files=extra_files)


class TorchOp:
    """The callable ``tile.torch.op`` returns; ``.op`` is the ``torch.library`` operator (and
    ``.backward_op`` the one running the gradient program)."""

    def __init__(self, core: Op, name: str, device: str | None):
        core.what = f"tile.torch op '{name}'"
        self.core = core
        self.name = name
        self.device = device
        args = ", ".join(f"Tensor {n}" for n in core.inputs)
        outs = "Tensor" if len(core.outputs) == 1 else f"({', '.join(['Tensor'] * len(core.outputs))})"
        lib = torch.library.custom_op
        self.op = lib(f"tile::{name}", self._forward, mutates_args=(), schema=f"({args}) -> {outs}")
        self.op.register_fake(self._fake)
        sep = ", " if args else ""
        self.backward_op = lib(
            f"tile::{name}_backward",
            self._backward_impl,
            mutates_args=(),
            schema=f"({args}{sep}Tensor?[] cotangents, int[] wrt) -> Tensor[]",
        )
        self.backward_op.register_fake(self._backward_fake)
        self.op.register_vmap(self._vmap)
        self._call = self.op._opoverload  # the operator itself, past CustomOpDef's Python wrapper
        register_autograd(self)  # reverse and forward mode, torch.func (tile.torch_autograd)
        self._derived_ops: dict[str, TorchOp] = {}  # derived program text -> its op (gradient, JVP)
        # the Tile device CPU tensors are used in place on (None: copies, the general path)
        default = device or DEFAULT_DEVICES["cpu"]
        self._in_place = default if default.startswith("llvm_cpu") else None
        # CUDA tensors skip the dispatcher where they run on cuda.N (or the default device)
        self._cuda = device is None or device.startswith("cuda.")
        self._arity = len(core.inputs)
        self._lanes: dict[tuple, TorchLane | None] = {}  # signature -> the forward's fast lane
        self._grad_lanes: dict[tuple, TorchLane | None] = {}  # (wrt, signature) -> the backward's
        self._hot = None  # the last eager call's hot path (``tile.torch_hot``), or None

    def __call__(self, *tensors: torch.Tensor):
        hot = self._hot  # (the last eager call's signature, whole: ``tile.torch_hot.HotCall.call``;
        if hot is not None and not _dynamo_compiling():  # C where compiled: Dynamo traces none)
            outs = hot(tensors)
            if outs is not None:
                return outs
        # (PLAIN and AUTOGRAD mean every input is a torch.Tensor: no per-input checks on those paths)
        kind = _eager_kind(tensors, self._cuda) if len(tensors) == self._arity else DISPATCH
        if kind == PLAIN:
            sig = signature(tensors)
            outs = self._forward_at(sig, tensors)  # what the dispatcher would call
        elif kind == AUTOGRAD:
            sig = signature(tensors)
            outs = eager_apply(self, tensors)
        else:
            return self._general(kind, tensors)
        hot = self._hot_at(sig)
        self._hot = hot and hot.call
        return outs

    def _hot_at(self, sig: tuple) -> HotCall | None:
        """The hot path at ``sig`` (made once its forward's lane is kept), or None."""
        lane = self._lanes.get(sig)
        if lane is None:
            return None
        if lane.hot is None:
            lane.hot = HotCall.of(self, sig, lane) or False
        return lane.hot or None

    def _general(self, kind: int, tensors):
        """A call that something watches (``DISPATCH``, ``TRANSFORM``) or of a wrong count."""
        if len(tensors) != self._arity:
            self.core.tile_types(tuple(((), np.float32) for _ in tensors))  # the arity error
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TileInputError(
                    f"{self.core.what}: input '{self.core.inputs[i]}' is {_what(t)}, not a tensor",
                    self.core._span(self.core.inputs[i]),
                    hint="pass a torch.Tensor for every input of the Tile function, in its order "
                    "(e.g. torch.tensor(x) for a number)",
                )
        if kind == TRANSFORM:
            return TileFunction.apply(self, *tensors)
        return self._call(*tensors)

    def __reduce__(self):
        """Pickled (``copy.deepcopy``, ``torch.save``) as what defines it; loading gives the op of
        that name back, made again from its source where this process has none yet."""
        core = self.core
        return (_rebuilt, (core.text, self.name, self.device, dict(core.settings), core.has_gradient))

    def _run(self, tensors):
        """The outputs, by the kernel itself or (where anything would see the difference) through
        the dispatcher; what ``TileFunction.forward`` does."""
        return self._call(*tensors) if self._dispatching(tensors) else self._forward(*tensors)

    def _dispatching(self, tensors) -> bool:
        return _eager_kind(tensors, self._cuda) >= DISPATCH

    def _derived(self, program, kind: str) -> TorchOp:
        """The op running a program derived from this one's (one per program text: its sizes are
        concrete), named ``<name>_<kind>_<hash>``, on the same device with the same settings."""
        text = str(program)
        found = self._derived_ops.get(text)
        if found is None:
            digest = hashlib.sha1(text.encode()).hexdigest()[:10]
            found = self._derived_ops[text] = op(
                text, name=f"{self.name}_{kind}_{digest}", device=self.device, settings=self.core.settings
            )
        return found

    @staticmethod
    def _torch_dtype(dtype: np.dtype) -> torch.dtype:
        return _TO_TORCH[np.dtype(dtype)]

    def __repr__(self) -> str:
        ins = ", ".join(self.core.inputs)
        return f"tile.torch.op({self.name}: ({ins}) -> ({', '.join(self.core.outputs)}))"

    # -- kernels ------------------------------------------------------------------------------

    _signature = staticmethod(signature)  # (what a lane is kept by, for ``tile.torch_autograd``)

    def _forward(self, *tensors: torch.Tensor):
        return self._forward_at(signature(tensors), tensors)

    def _forward_at(self, sig: tuple, tensors):
        """``_forward`` of ``tensors`` whose ``signature`` is ``sig``."""
        lane = self._lanes.get(sig)
        if lane is not None and lane.hot:  # (``TileEagerFunction.forward``'s too: no grad mode
            outs = lane.hot.plain(tensors)  # inside it)
            if outs is not None:
                return outs
        outs = through_lane(self._lanes, sig, tensors)
        if outs is not None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        result = self._forward_general(tensors)
        if sig not in self._lanes:
            learn(self, self._lanes, sig, tensors, None, _TO_NUMPY, _TO_TORCH)
        return result

    def _forward_general(self, tensors):
        if self._in_place:
            result = self._forward_in_place(tensors)
            if result is not None:
                return result
        where = self._where(tensors)
        note: list[str] = []
        result = self._shared(where, tensors, note)
        if result is None:
            arrays, key, copies = self._arrays(tensors, where)
            self.core.out_types(key)  # a shape or dtype mismatch: in the caller's terms
            outs = self.core.forward(where[0], arrays, key)
            result = self._tensors(outs, where, note + copies)
        return result[0] if len(result) == 1 else tuple(result)

    def _forward_in_place(self, tensors):
        """``_forward`` for the common case, lean (a 1-element call is mostly overhead): contiguous
        CPU tensors of numpy's dtypes on ``llvm_cpu.0``; None for anything else."""
        arrays = []
        for t in tensors:
            if (not t.is_cpu or t.layout is not torch.strided or not ordinary(t) or t.dtype not in _IN_PLACE
                    or not t.data_ptr()):
                return None
            arrays.append(t.detach().numpy() if t.requires_grad else t.numpy())
        outs = self.core.forward(self._in_place, arrays, tuple([(a.shape, a.dtype) for a in arrays]))
        if os.environ.get("TILE_DEBUG", "0") < "1":
            try:
                if len(outs) == 1:
                    return torch.from_numpy(outs[0])
                return tuple([torch.from_numpy(o) for o in outs])
            except TypeError:  # a bfloat16 output, which torch.from_numpy does not take
                pass
        result = self._tensors(outs, (self._in_place, torch.device("cpu"), True), [])
        return result[0] if len(result) == 1 else tuple(result)

    def _fake(self, *tensors: torch.Tensor):
        types = self._types(tensors)
        device = tensors[0].device if tensors else torch.device("cpu")
        result = [torch.empty(shape, dtype=_TO_TORCH[dtype], device=device) for shape, dtype in types]
        return result[0] if len(result) == 1 else tuple(result)

    def _types(self, tensors) -> list:
        dtypes = [self._np_dtype(t, i) for i, t in enumerate(tensors)]
        shapes = [tuple(t.shape) for t in tensors]
        if all(isinstance(d, int) for s in shapes for d in s):
            return list(self.core.out_types(self.core.key(shapes, dtypes)))
        found = self.core.symbolic_out_shapes(shapes, dtypes, (torch.sym_max, torch.sym_min), _held_equal)
        if found is not None:
            return found
        concrete = [tuple(int(d) for d in s) for s in shapes]  # specializes (a guard on each size)
        return list(self.core.out_types(self.core.key(concrete, dtypes)))

    def _vmap(self, info, in_dims, *tensors):
        """``torch.func.vmap``: a loop over the batch, the op once per element (as tile.jax)."""
        rows = []
        for b in range(info.batch_size):
            args = [t if d is None else t.select(d, b) for t, d in zip(tensors, in_dims)]
            out = self.op(*args)
            rows.append(out if isinstance(out, tuple) else (out,))
        stacked = tuple(torch.stack(col) for col in zip(*rows))
        if len(stacked) == 1:
            return stacked[0], 0
        return stacked, (0,) * len(stacked)

    def _backward_impl(self, *args):
        n = len(self.core.inputs)
        return self._backward_at(signature(args[:n]), args[:n], args[n], list(args[n + 1]))

    def _backward_at(self, sig: tuple, tensors, cotangents, wrt: list[int]):
        """``_backward_impl`` of inputs ``tensors`` whose ``signature`` is ``sig``."""
        if not wrt:
            return []
        both = (*tensors, *cotangents)
        slot = (tuple(wrt), sig, signature(cotangents))
        grads = through_lane(self._grad_lanes, slot, both)
        if grads is not None:  # (a lane's gradients are its inputs' types where ``conform``)
            return grads if self._grad_lanes[slot].conform else as_inputs(grads, tensors, wrt)
        result = self._backward_general(tensors, cotangents, wrt)
        if slot not in self._grad_lanes:
            learn(self, self._grad_lanes, slot, both, wrt, _TO_NUMPY, _TO_TORCH)
        return result

    def _backward_general(self, tensors, cotangents, wrt):
        where = self._where(tensors)
        note: list[str] = []
        result = self._shared(where, tensors, note, cotangents, wrt)
        if result is not None:
            return result
        arrays, key, copies = self._arrays(tensors, where)
        cots, _, _ = self._arrays([c for c in cotangents if c is not None], where, "cotangent")
        it = iter(cots)
        cot_arrays = [None if c is None else next(it) for c in cotangents]
        grads = self.core.backward(where[0], arrays, cot_arrays, wrt, key)
        return self._tensors(grads, where, note + copies)

    def _backward_fake(self, *args):
        n = len(self.core.inputs)
        return [args[i].new_empty(args[i].shape) for i in args[n + 1]]

    # -- tensors <-> arrays -------------------------------------------------------------------

    def _where(self, tensors) -> tuple[str, torch.device, bool]:
        """(Tile device, the tensors' torch device, whether they are used in place)."""
        device = tensors[0].device if tensors else torch.device("cpu")
        for i, t in enumerate(tensors):
            if t.device != device:
                raise TileInputError(
                    f"{self.core.what}: input '{self.core.inputs[i]}' is on {t.device}, "
                    f"'{self.core.inputs[0]}' on {device}",
                    self.core._span(self.core.inputs[i]),
                    hint="move every input to one device",
                )
        tile_device = self.device or DEFAULT_DEVICES.get(device.type)
        if tile_device is not None and device.type == "cuda" and not self.device:
            from tile import torch_cuda

            tile_device = torch_cuda.default_device(device, tile_device)
        if tile_device is None:
            raise TileInputError(
                f"{self.core.what}: tensors on '{device.type}' have no Tile device",
                None,
                hint="use CPU or CUDA tensors, or pass device= to tile.torch.op",
            )
        in_place = device.type == "cpu" and tile_device.startswith("llvm_cpu")
        return tile_device, device, in_place

    def _np_dtype(self, t: torch.Tensor, i: int, what: str = "input") -> np.dtype:
        dt = _TO_NUMPY.get(t.dtype)
        if dt is None:
            name = self.core.inputs[i] if what == "input" and i < len(self.core.inputs) else str(i)
            raise TileInputError(
                f"{self.core.what}: {what} '{name}' is a {t.dtype} tensor, which Tile does not have",
                None,
                hint="pass bool, integer, float16, bfloat16, float32 or float64 tensors",
            )
        return dt

    def _arrays(self, tensors, where, what: str = "input") -> tuple[list[np.ndarray], tuple, list[str]]:
        """numpy arrays of ``tensors``: views of their memory on the host (a copy only for a
        non-contiguous one), host copies of device tensors; the key; what was copied."""
        arrays, note = [], []
        copied = 0
        for i, t in enumerate(tensors):
            dt = self._np_dtype(t, i, what)
            name = self.core.inputs[i] if what == "input" else i
            if t.layout is not torch.strided:
                raise TileInputError(
                    f"{self.core.what}: {what} '{name}' is a {t.layout} tensor, which Tile does not read",
                    None,
                    hint="pass a dense tensor (e.g. t.to_dense())",
                )
            if t.requires_grad:
                t = t.detach()
            if not ordinary(t):  # strided, a negative view, a ZeroTensor: its values, copied
                why = "was not contiguous" if not t.is_contiguous() else "is a negative view or a ZeroTensor"
                t = materialized(t)
                note.append(f"{what} '{name}' {why}: copied")
            if t.numel() and not t.data_ptr():
                raise TileInputError(
                    f"{self.core.what}: {what} '{name}' has no memory of its own (a wrapper tensor?)",
                    None,
                    hint="pass an ordinary tensor (e.g. torch._from_functional_tensor(t) for a "
                    "functionalization wrapper)",
                )
            if t.device.type != "cpu":
                t = t.cpu()
                copied += t.nbytes
            if t.dtype == torch.bfloat16:
                arrays.append(t.view(torch.int16).numpy().view(dt))
            else:
                arrays.append(t.numpy())
        if copied:
            note.append(f"{copied} bytes copied to the host")
        key = tuple((a.shape, a.dtype) for a in arrays)
        return arrays, key, note

    def _shared(self, where, tensors, note: list[str], cotangents=None, wrt=None) -> list | None:
        """The outputs (``wrt`` None) or the gradients for ``wrt`` of a call on CUDA tensors, run in
        memory CUDA and the Tile device share (``tile.torch_cuda.shared``); None where the call is
        not on CUDA tensors, or sharing is unavailable or fails (why: added to ``note``)."""
        if where[1].type != "cuda":
            return None
        from tile import torch_cuda  # loads the OpenCL and CUDA drivers' bindings: on first use

        return torch_cuda.shared(self, where, tensors, note, cotangents, wrt)

    def _say(self, tile_device: str, path: str, note: list[str]) -> None:
        """``TILE_DEBUG=1``'s line for a call: the path it took and what it copied."""
        if os.environ.get("TILE_DEBUG", "0") >= "1":
            extra = f"; {'; '.join(note)}" if note else ""
            print(f"tile.torch: {self.name} on {tile_device}: {path}{extra}", file=sys.stderr)

    def _tensors(self, arrays, where, note: list[str]) -> list[torch.Tensor]:
        tile_device, device, in_place = where
        result = []
        copied = 0
        for a in arrays:
            if a.dtype == _TO_NUMPY.get(torch.bfloat16):
                t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(a if a.flags.writeable else a.copy())
            if device.type != "cpu":
                t = t.to(device)
                copied += t.nbytes
            result.append(t)
        if os.environ.get("TILE_DEBUG", "0") >= "1":
            if in_place:
                path = "zero-copy (inputs read in place, outputs written into the returned tensors' memory)"
            elif device.type == "cpu":
                path = f"host copies into and out of {tile_device}'s buffers"
            else:
                path = f"host copies ({device.type} -> host -> {tile_device} -> host -> {device.type})"
            if copied:
                note = [*note, f"{copied} bytes copied back to {device}"]
            self._say(tile_device, path, note)
        return result


def _held_equal(a, b) -> bool:
    """Two sizes the fake kernel takes as one (a ``SymInt`` and an ``nn.Module`` weight's number):
    a runtime check that torch's shape environment knows (and uses to simplify); False where the
    traced sizes already differ."""
    try:
        torch._check(a == b)
    except Exception:  # noqa: BLE001 - the sizes differ: Tile reports the mismatch
        return False
    return True


def _what(x) -> str:
    return "None" if x is None else f"a {type(x).__name__}"
