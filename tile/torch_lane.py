"""The fast lane of ``tile.torch`` calls: an op called again at a signature it has run at.

After a call's general path (``TorchOp._forward`` / ``_backward_impl``) has compiled and run the
program for a signature (each input's dtype, shape and device), the op keeps a ``TorchLane`` for
it: later calls at that signature pass their tensors' ``data_ptr()``s straight to the kernels
(``backends.lane.Lane``) and get outputs from ``torch.empty`` (``torch.zeros`` where the program
needs them zeroed), on torch's own allocator and, for CUDA, torch's current stream. No numpy view,
no ``tile.Tensor``, no events: what is left of a call is a dictionary lookup, a pointer per tensor
and a launch per kernel.

Only the devices whose executors launch on raw addresses have lanes (``llvm_cpu.N`` for CPU
tensors, ``cuda.N`` for CUDA tensors). A strided tensor (or a negative view, a ``ZeroTensor``) is
copied contiguous first, as the general path copies it. A call takes the general path instead
where two inputs share memory, a tensor is sparse, a cotangent is missing, or the device has
general work queued; ``TILE_DEBUG`` turns lanes off (it reports the general path's work).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as fwAD

from backends.lane import Lane
from backends.runner import debug_on

LANES_KEPT = 64  # signatures an op keeps fast lanes for (each holds its program's buffers)

PLAIN, AUTOGRAD, DISPATCH, TRANSFORM = 0, 1, 2, 3  # how an eager call runs (``tile.torch._eager_kind``)


def _plain_types() -> tuple[type, ...]:
    """The tensor types whose calls nothing else sees: ``torch.Tensor``, and ``nn.Parameter``
    where it disables ``__torch_function__`` (as it does: torch treats it as a plain tensor)."""
    parameter = torch.nn.Parameter
    if parameter.__torch_function__ is torch._C._disabled_torch_function_impl:
        return (torch.Tensor, parameter)
    return (torch.Tensor,)


PLAIN_TYPES = _plain_types()  # (a module's weights among them: its calls are eager ones too)


def watched() -> int:
    """What watches an eager call now, whatever its tensors: ``DISPATCH`` (``torch.compile``,
    tracing, a torch function or dispatch mode, forward-mode AD), ``TRANSFORM`` (a functorch
    transform), or ``PLAIN`` (0: nothing)."""
    if torch.compiler.is_compiling():  # first: Dynamo reads it as True and traces no further
        return DISPATCH
    C = torch._C
    if C._are_functorch_transforms_active():
        return TRANSFORM
    if (
        C._is_torch_function_mode_enabled()
        or C._len_torch_dispatch_stack()
        or C._get_tracing_state() is not None
        or fwAD._current_level >= 0
    ):
        return DISPATCH
    return PLAIN


def unwatched() -> tuple:
    """``watched()`` as data, for a call compiled to C (``tile.torch_hot``'s entry): reads that
    each give the value it names when nothing watches a call, ``(read, obj, key, value)`` as
    ``backends.llvm.callentry.Check`` takes them (``call``: ``obj()``; ``item``: ``obj[key]``).
    The same tests in the same order, through cheaper equivalents where torch has them: the flag
    ``torch.compiler.is_compiling`` returns (outside TorchScript), ``_is_tracing`` for
    ``_get_tracing_state() is not None``. Change it with ``watched``."""
    C = torch._C
    return (
        ("item", vars(torch.compiler), "_is_compiling_flag", False),

        ("call", C._are_functorch_transforms_active, None, False),
        ("call", C._is_torch_function_mode_enabled, None, False),
        ("call", C._len_torch_dispatch_stack, None, 0),
        ("call", C._is_tracing, None, False),
        ("item", vars(fwAD), "_current_level", -1),
    )


def signature(tensors) -> tuple:
    """What a lane is kept by: each tensor's dtype, shape and device (None for a missing one)."""
    return tuple([None if t is None else (t.dtype, t.shape, t.device) for t in tensors])


class TorchLane:
    """A ``Lane`` for one signature, with the outputs' torch types (``to_torch``: numpy dtype ->
    torch dtype) on ``device``; ``__call__`` gives the outputs, or None for the general path."""

    __slots__ = ("conform", "every", "hot", "lane", "outputs", "reads", "single", "_launch")

    def __init__(self, lane: Lane, device: torch.device, to_torch, reads: tuple[bool, ...], tensors=(),
                 wrt: tuple[int, ...] | None = None):
        self.lane = lane
        # (make, shape, dtype, device, the input it is made like or None); (None, ..., input) for
        # an output that is that input (``Lane.aliases``)
        self.outputs = []
        for o, ((shape, dtype), zero) in enumerate(zip(lane.output_types, lane.zeroed_outputs)):
            if o in lane.aliases:
                self.outputs.append((None, None, None, None, lane.aliases[o]))
                continue
            dt = to_torch[dtype.numpy]
            like = next((i for i, t in enumerate(tensors)
                         if t is not None and t.dtype == dt and tuple(t.shape) == tuple(shape)), None)
            if like is not None:  # (``empty_like`` of a contiguous input: half ``empty``'s cost)
                self.outputs.append((torch.zeros_like if zero else torch.empty_like, None, None, None, like))
            else:
                self.outputs.append((torch.zeros if zero else torch.empty, shape, dt, device, None))
        # the lane's call on the inputs' and outputs' addresses: none on a host where it has
        # nothing to run, as a gradient that is its cotangent's has not
        self._launch = _nothing if lane.executor.raw_host and lane.runs_nothing else lane
        self.hot = None  # a forward's ``tile.torch_hot.HotCall`` at its signature (``TorchOp``'s)
        self.reads = reads  # per input place: whether the program reads it
        self.every = all(reads)  # (then a missing tensor is the general path's at once)
        self.single = sum(reads) <= 1  # (then no two of them can share an address)
        # a backward's (``wrt``): whether each output is already its gradient's input's type
        self.conform = wrt is None or all(
            tuple(shape) == tuple(tensors[i].shape) and to_torch[dtype.numpy] == tensors[i].dtype
            for (shape, dtype), i in zip(lane.output_types, wrt)
        )

    @classmethod
    def of(cls, program, inputs, outputs, device: torch.device, to_torch, tensors=(),
           wrt: tuple[int, ...] | None = None) -> TorchLane | None:
        """The lane of ``program`` (its input names in the caller's order, None where it reads
        nothing) for tensors like ``tensors`` (whose outputs of the same shape and dtype are made
        ``empty_like`` them), or None. ``wrt``: a backward's, its outputs the gradients of these
        inputs; one that is an input unchanged is that input tensor, as torch's own backward
        formulas give them."""
        lane = Lane.of(program, inputs, outputs, alias=wrt is not None)
        if lane is None or any(dtype.numpy not in to_torch for _, dtype in lane.output_types):
            return None
        return cls(lane, device, to_torch, tuple(n is not None for n in inputs), tensors, wrt)

    def __call__(self, tensors) -> list[torch.Tensor] | None:
        if self.every:  # (the common case, lean: a 1-element call is mostly this)
            pointers = []
            for t in tensors:
                if t is None or t.layout is not _STRIDED:
                    return None  # (a sparse tensor: the general path refuses it)
                if not ordinary(t):
                    return self._ordinary(tensors)
                p = t.data_ptr()
                if not p:
                    return None  # (no memory: a functionalization wrapper; the general path refuses it)
                pointers.append(p)
            if not self.single and len(set(pointers)) != len(pointers):
                return None
            return self._run(tensors, pointers)
        pointers, present = [], []
        for t, read in zip(tensors, self.reads):
            if t is None:
                if read:
                    return None  # a missing cotangent the program reads: zeros, on the general path
                pointers.append(0)
            elif t.layout is not _STRIDED:
                return None
            elif not ordinary(t):
                return self._ordinary(tensors)
            else:
                p = t.data_ptr()
                if not p:
                    return None
                pointers.append(p)
                present.append(p)
        if len(present) > 1 and len(set(present)) != len(present):
            return None  # two tensors at one address: the general path copies
        return self._run(tensors, pointers)

    def _ordinary(self, tensors) -> list[torch.Tensor] | None:
        """The call with each tensor that is not ``ordinary`` copied so first
        (``loss.sum().backward()``'s cotangent is one value broadcast: stride 0), as the general
        path would copy it; the copies live through the launches (CUDA: on the stream they were
        made on)."""
        return self([t if t is None or ordinary(t) else materialized(t) for t in tensors])

    def usual(self) -> tuple[Callable, int, Callable] | None:
        """``(make, like, run)`` for the usual lane: one output, made by ``make(tensors[like])``
        (``empty_like``), a lane that runs (``Lane.run`` on the inputs' then the output's
        addresses); None for any other."""
        if len(self.outputs) != 1 or self._launch is _nothing:
            return None
        make, _, _, _, like = self.outputs[0]
        if make is None or like is None:
            return None
        return make, like, self.lane.run

    def launcher(self, form: bool = False) -> Callable:
        """``go(tensors, pointers)``: the call's outputs made (or, for an alias, the input they
        are) and the lane run on ``pointers`` (the inputs' addresses, checked by the caller: 0 for
        a place not read) then the outputs'; None where the lane declines (general work queued).
        The outputs as a list, or (``form``) as an op gives them: one tensor, or a tuple. What
        ``tile.torch_hot`` runs once it has checked a call."""
        made, run = self._made, self._launch
        one = len(self.outputs) == 1
        if one and self.outputs[0][0] is not None and self.outputs[0][4] is not None:
            make, _, _, _, like = self.outputs[0]  # (one output made like an input: the usual)
            if run is not _nothing:
                run = self.lane.run

                def go(tensors, pointers):  # (the usual, whole: a 1-element call is mostly this)
                    out = make(tensors[like])
                    return None if not run((*pointers, out.data_ptr())) else out if form else [out]
                return go

            def made(tensors):
                return [make(tensors[like])]
        shape = (lambda outs: outs[0] if one else tuple(outs)) if form else (lambda outs: outs)
        if run is _nothing:
            def go(tensors, pointers):
                return shape(made(tensors))
            return go
        run = self.lane.run

        def go(tensors, pointers):
            outs = made(tensors)
            return shape(outs) if run((*pointers, *[o.data_ptr() for o in outs])) else None
        return go

    def _made(self, tensors) -> list[torch.Tensor]:
        """The call's outputs, made (or, for an alias, the input they are)."""
        return [make(shape, dtype=dtype, device=device) if like is None
                else tensors[like] if make is None else make(tensors[like])
                for make, shape, dtype, device, like in self.outputs]

    def _run(self, tensors, pointers: list[int]) -> list[torch.Tensor] | None:
        outs = self._made(tensors)
        if not self._launch(pointers, [o.data_ptr() for o in outs]):
            return None
        return outs


_STRIDED = torch.strided


def ordinary(t: torch.Tensor) -> bool:
    """Whether a strided tensor's memory holds its values, in order: contiguous, not a negative
    view (``torch._neg_view``: the values negated), not a ``ZeroTensor`` (no memory)."""
    return t.is_contiguous() and not t.is_neg() and not t._is_zerotensor()


def materialized(t: torch.Tensor) -> torch.Tensor:
    """A strided tensor's values in memory of their own, in order (``ordinary``): a copy unless
    it is so already."""
    if t.is_neg():
        t = t.resolve_neg()
    if t._is_zerotensor():
        t = t.clone()
    return t.contiguous()


def _nothing(inputs, outputs) -> bool:
    return True


def through_lane(lanes: dict, slot: tuple, tensors) -> list[torch.Tensor] | None:
    """The outputs of ``tensors``' call through the lane kept in ``lanes[slot]``, or None (no lane,
    ``TILE_DEBUG``, or one the lane cannot take): the general path's to run."""
    lane = lanes.get(slot)
    if lane is None or debug_on():
        return None
    return lane(tensors)


def learn(op, lanes: dict, slot: tuple, tensors, wrt, to_numpy, to_torch) -> None:
    """Keep in ``lanes[slot]`` the lane of ``op`` (a ``tile.torch.TorchOp``) for a signature whose
    general call just ran (``wrt``: its backward's, ``tensors`` the inputs then the cotangents), or
    None where it has none: a device without raw calls, a cotangent of another type than its
    output (the general path converts it). ``to_numpy``/``to_torch`` map dtypes."""
    if len(lanes) >= LANES_KEPT:  # (kept none: the general path from now on)
        return
    lane = None
    live = [t for t in tensors if t is not None]
    if live:  # (a strided tensor: the lane copies it contiguous, as the general path does)
        device = live[0].device
        cpu = device.type == "cpu" and op._in_place
        tile_device = op._in_place if cpu else op._where(live)[0]
        if device.type == "cpu" and tile_device.startswith("llvm_cpu") or (
            device.type == "cuda" and tile_device.startswith("cuda.")
        ):
            n = len(op.core.inputs)
            key = op.core.key([tuple(t.shape) for t in tensors[:n]],
                              [op._np_dtype(t, i) for i, t in enumerate(tensors[:n])])
            if wrt is None or all(
                c is None or (tuple(c.shape), to_numpy.get(c.dtype)) == typ
                for c, typ in zip(tensors[n:], op.core.out_types(key))
            ):
                program, ins, names = op.core.lane_names(tile_device, key, wrt)
                lane = TorchLane.of(program, ins, names, device, to_torch, tensors,
                                    None if wrt is None else tuple(wrt))
    lanes[slot] = lane


__all__ = [
    "AUTOGRAD", "DISPATCH", "LANES_KEPT", "PLAIN", "PLAIN_TYPES", "TRANSFORM", "TorchLane", "learn",
    "materialized", "ordinary", "signature", "through_lane", "unwatched", "watched",
]
