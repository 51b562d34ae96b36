"""A ``tile.torch`` op's whole eager call at one signature as one function: the hot path.

After a call at a signature has run (and kept its fast lane, ``tile.torch_lane``), the op keeps
``HotCall`` for it. Its ``call`` does, in one pass, what the usual path does in several (the
dispatch checks of ``tile.torch._eager_kind``, the signature, the lane's lookup, its checks and
its launch): a small call is mostly this overhead (a 1-element add: ~1 us of torch's own work).

* No gradient wanted: the outputs made and the lane launched on the tensors' addresses.
* A gradient wanted: ``TileHotFunction`` (a ``torch.autograd.Function``) applied through the C
  part of ``Function.apply``. Its forward launches the lane; its backward runs the backward's lane
  (``hot_backward``, once the general path has kept one for these inputs) with the cotangents
  checked once, or else the general backward (``tile.torch_autograd.backward_of``).

Every check of the usual path stays; each sends the call back to it (None), where it runs as
before: something watches the call (``tile.torch_lane.watched``: compile, tracing, modes,
functorch, forward-mode AD), ``TILE_DEBUG``, a wrong count, a tensor that is not a contiguous
tensor of ``PLAIN_TYPES`` (``torch.Tensor``, ``nn.Parameter``) on the signature's device (the CPU,
or one CUDA device: there without a gradient, see ``HotCall``) and of its dtype and shape, a
negative view
(``torch._neg_view``: its memory holds the values negated), one without memory (a
``ZeroTensor``, a dead functorch wrapper, a sparse tensor: ``data_ptr``/``is_contiguous`` raise or
give 0), two tensors at one address, general work queued on the device. A strided cotangent is
copied contiguous first, as the general path copies it.

Compiled: once the lane has its native entry (a small one), ``call`` becomes one builtin of C
doing the same (``compiled_call``, ``backends.llvm.callentry``: a
1-element add 3.1 -> 1.4 us of CPU time, torch's 1.1); what it declines goes to the Python
``call`` above, which stays the reference. ``COMPILED_CALLS`` and ``TENSOR_GUARDS`` switch it, and
its tensors' guards, off.
"""

from __future__ import annotations

import ctypes
import inspect
from collections.abc import Callable

import torch

from backends.runner import _DEBUG_KEY, _ENVIRON, debug_on
from tile.torch_autograd import backward_of, c_apply
from tile.torch_dtypes import TO_TORCH
from tile.torch_lane import PLAIN_TYPES, TorchLane, unwatched, watched

__all__ = [
    "COMPILED_CALLS", "TENSOR_GUARDS", "HotCall", "TileHotFunction", "checker", "compiled_call",
    "hot_backward",
]

_MISSING = object()


def checker(types, reads=None, distinct: bool = False, cuda: int | None = None) -> Callable:
    """``check(tensors)``: each tensor's address (0 for a place not read: ``reads``, None for
    every place read), or None where one read is not a contiguous CPU tensor (``cuda``: a tensor
    on CUDA device ``cuda``) of ``PLAIN_TYPES``
    and of its ``(dtype, shape)`` in ``types`` with memory of its own values (not a negative view,
    not a ``ZeroTensor``, not storage-less), or (``distinct``) two read share an address. Made per
    signature with its loop unrolled (the checks of a 2-input call: ~1.1 us, not ~1.55 as a
    loop)."""
    reads = reads or (True,) * len(types)
    lines = ["def check(tensors):", *_checks(types, reads, distinct, cuda),
             f"    return [{', '.join(f'p{i}' if reads[i] else '0' for i in range(len(types)))}]"]
    return _compiled(lines, types, {}, "check")


def _checks(types, reads, distinct: bool, cuda: int | None = None) -> list[str]:
    """``checker``'s body: ``t0, t1, ...`` unpacked from ``tensors``, each read one's address in
    ``p0, p1, ...``, ``return None`` where a check fails (``cuda``: the tensors' CUDA device, else
    the CPU)."""
    names = [f"t{i}" for i in range(len(types))]
    read = [i for i in range(len(types)) if reads[i]]
    unpack = f"{', '.join(names)}, = tensors" if names else "() = tensors"
    lines = ["    try:", f"        {unpack}"]

    def on(i: int) -> str:  # (``get_device``: -1 on the CPU)
        return f"not t{i}.is_cpu" if cuda is None else f"t{i}.get_device() != {cuda}"
    if read:
        checks = " or ".join(
            f"type(t{i}) is not Tensor and type(t{i}) not in PLAIN_TYPES or {on(i)} "
            f"or t{i}.dtype is not dt{i} "
            f"or t{i}.shape != shape{i} or not t{i}.is_contiguous() or t{i}.is_neg()" for i in read)
        lines += [f"        if {checks}:", "            return None"]
        lines += [f"        p{i} = t{i}.data_ptr()" for i in read]
    lines += ["    except (RuntimeError, ValueError):  # (no storage: a dead functorch wrapper; a sparse "
              "tensor; a wrong count)",
              "        return None"]
    if read:
        lines += [f"    if not ({' and '.join(f'p{i}' for i in read)}):  # (0: a ZeroTensor, no memory)",
                  "        return None"]
    if distinct and len(read) > 1:
        pairs = [f"p{i} == p{j}" for k, i in enumerate(read) for j in read[k + 1:]]
        every = ", ".join(f"p{i}" for i in read)
        same = " or ".join(pairs) if len(pairs) <= 6 else f"len({{{every}}}) != {len(read)}"
        lines += [f"    if {same}:  # (one tensor twice: the general path copies)", "        return None"]
    return lines


def _compiled(lines: list[str], types, scope: dict, name: str) -> Callable:
    """The function ``name`` that ``lines`` define, with the types' ``dt<i>``/``shape<i>`` and
    ``scope`` as its globals."""
    scope = {"Tensor": torch.Tensor, "PLAIN_TYPES": PLAIN_TYPES, **scope}
    for i, (dt, shape) in enumerate(types):
        scope[f"dt{i}"], scope[f"shape{i}"] = dt, shape
    exec(compile("\n".join(lines), f"<tile.torch_hot {name} of {len(types)} tensors>", "exec"), scope)
    return scope[name]


class HotCall:
    """One signature's eager call (``sig``, ``tile.torch_lane.signature``) of ``op`` through its
    forward's ``lane``: ``call`` (every eager call, a gradient too) and ``plain`` (no gradient:
    ``TorchOp._forward_at``'s, which may run below autograd, where a gradient is not its to make).
    ``of`` gives None for a lane that reads inputs selectively, or neither on a host nor on CUDA.

    On CUDA (``cuda``: the tensors' device index) the hot call is the no-gradient one: a call
    wanting a gradient, and every backward, take the general path (the lane launches on torch's
    current stream as there); it is never compiled to C."""

    __slots__ = ("op", "sig", "lane", "call", "plain", "ints", "entry", "cuda", "_types", "_grads", "_launch")

    def __init__(self, op, sig: tuple, lane: TorchLane):
        self.op, self.sig, self.lane = op, sig, lane
        self._types = tuple((dt, shape) for dt, shape, _ in sig)
        device = sig[0][2]
        self.cuda = None if device.type == "cpu" else int(device.index or 0)
        self._launch = lane.launcher(form=True)
        # the outputs no gradient flows through (integers: marked non-differentiable)
        self.ints = tuple(i for i, (_, dtype) in enumerate(lane.lane.output_types) if not dtype.is_float)
        self._grads: dict = {}  # ``ctx.needs_input_grad`` -> the backward's hot function, or None
        self.plain = self._made(False)
        self.call = self._made(True) if self.cuda is None else self.plain
        self.entry = None  # the call compiled to C (``compiled_call``), once the lane has its entry
        if compiled_calls() and self.cuda is None:
            lane.lane.on_entry = self._compile
            if lane.lane._entry is not None:
                self._compile()

    def _compile(self) -> None:
        """``call`` as one builtin (``compiled_call``), from now on ``call`` and the op's call
        where it is this signature's."""
        try:
            entry = compiled_call(self)
        except (RuntimeError, ValueError, TypeError, OSError) as e:  # (LLVM's, or a layout refused)
            if debug_on():
                print(f"[tile] {self.op.name}: its call stays Python ({type(e).__name__}: {e})")
            return
        if entry is None:
            return
        old, self.entry, self.call = self.call, entry, entry.fn
        if self.op._hot is old:
            self.op._hot = entry.fn

    @classmethod
    def of(cls, op, sig: tuple, lane: TorchLane | None) -> HotCall | None:
        if lane is None or not lane.every or not sig or None in sig:
            return None
        device = sig[0][2]
        host = lane.lane.executor.raw_host and device.type == "cpu"
        cuda = device.type == "cuda" and device.index is not None and not lane.lane.executor.raw_host
        if not (host or cuda) or any(d != device for _, _, d in sig):
            return None
        return cls(op, sig, lane)

    def _made(self, autograd: bool) -> Callable:
        usual = self.lane.usual()
        if usual is not None:
            return self._usual(autograd, *usual)
        check, n, launch = checker(self._types, distinct=True, cuda=self.cuda), len(self._types), self._launch
        C = torch._C
        grad_on, any_grad = C.is_grad_enabled, C._any_requires_grad
        apply = _HOT_APPLY

        def call(tensors):
            if len(tensors) != n or watched() or debug_on():
                return None
            pointers = check(tensors)
            if pointers is None:
                return None
            if grad_on() and any_grad(*tensors):
                # (``autograd``: every input a plain tensor, nothing watching: ``Function.apply``'s
                # C part, as ``tile.torch_autograd.eager_apply`` for such tensors)
                return apply(self, *tensors) if autograd else None
            return launch(tensors, pointers)
        return call

    def _usual(self, autograd: bool, make: Callable, like: int, run: Callable) -> Callable:
        """``_made`` for the usual lane (``TorchLane.usual``: one output, made like input
        ``like``, a lane that runs), as one function: the checks, the output and the run
        written out for this signature (a 1-element add: ~0.5 us of frames and lists less)."""
        n = len(self._types)
        ts = ", ".join(f"t{i}" for i in range(n))
        lines = [
            "def call(tensors):",
            f"    if len(tensors) != {n} or watched() or debug_on():",
            "        return None",
            *_checks(self._types, (True,) * n, True, self.cuda),
            f"    if grad_on() and any_grad({ts}):",
            f"        return apply(hot, {ts})" if autograd else "        return None",
            f"    out = make(t{like})",
            f"    return out if run(({''.join(f'p{i}, ' for i in range(n))}out.data_ptr())) else None",
        ]
        C = torch._C
        scope = {"watched": watched, "debug_on": debug_on, "grad_on": C.is_grad_enabled,
                 "any_grad": C._any_requires_grad, "apply": _HOT_APPLY, "hot": self, "make": make,
                 "run": run}
        return _compiled(lines, self._types, scope, "call")

    def forward(self, tensors) -> torch.Tensor | tuple:
        """``TileHotFunction``'s forward: the lane (the tensors were checked by ``call``), or the
        general path where the lane declines (general work queued)."""
        outs = self._launch(tensors, [t.data_ptr() for t in tensors])
        return self.op._forward_at(self.sig, tensors) if outs is None else outs

    def backward(self, ctx, grads) -> tuple | None:
        """``TileHotFunction``'s backward through the backward's lane, or None (the general one)."""
        needs = ctx.needs_input_grad
        fast = self._grads.get(needs, _MISSING)
        if fast is _MISSING:
            fast = hot_backward(self, needs)
            if fast is _MISSING:
                return None  # (no lane kept yet: the general backward keeps one)
            self._grads[needs] = fast
        return None if fast is None else fast(ctx, grads)


COMPILED_CALLS = True  # whether a hot call is compiled to C once its lane has an entry (``compiled_call``)


def compiled_calls() -> bool:
    """Whether calls are compiled to C here: ``COMPILED_CALLS``, on CPython (``debug_on``'s
    environment dict readable)."""
    return COMPILED_CALLS and _ENVIRON is not None and _DEBUG_KEY is not None


_BASE = torch._C.TensorBase.__dict__


def _read(place, name: str, want: str, value=None):
    """The check of tensor ``place``'s ``name`` (an attribute, or a method called with nothing):
    through its C function where every plain type has torch's own (as it has: ~15 ns less a
    read than the lookup), else by name."""
    from backends.llvm.callentry import Arg, Check, Out

    own = _BASE.get(name)
    direct = own is not None and all(inspect.getattr_static(t, name) is own for t in PLAIN_TYPES)
    method = callable(own) if own is not None else name not in ("is_cpu", "dtype", "shape")
    read = ("cmethod" if method else "get") if direct else ("method" if method else "attr")
    return Check(read, place if isinstance(place, Out) else Arg(place), own if direct else name, want, value)


TENSOR_GUARDS = True  # whether the compiled call checks its tensors as one (``_guards``)


def _guards(types) -> tuple | None:
    """The tensors' checks as two of Dynamo's ``TensorGuards`` (C++; ~0.2 us for two tensors,
    where reading each tensor's device, dtype, shape, contiguity and negative bit through torch's
    Python bindings is ~0.6), as ``backends.llvm.callentry`` checks: one passing for plain
    contiguous CPU ``torch.Tensor``s of these ``types`` needing no gradient, one (floats only) for
    such tensors each needing one. Each compares a tensor's exact Python type, dispatch keys
    (with the thread's included and excluded keys: its device, a negative or conjugate view, a
    ``ZeroTensor``, sparse, functionalization and functorch wrappers, inference mode, autocast
    and functorch transforms in force all differ), dtype, ``requires_grad``, sizes and strides
    (the contiguous ones) with the example's. Stricter than the Python path's checks (a
    ``Parameter``, inference mode, one input of two wanting a gradient: declined, to it);
    None where torch has no such class."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    from backends.llvm.callentry import Check

    check = TensorGuards.__dict__.get("check")

    def guard(examples):
        made = TensorGuards(*examples, dynamic_dims_sizes=[list(e.shape) for e in examples],
                            dynamic_dims_strides=[list(e.stride()) for e in examples])
        if not made.check(*examples):
            return None  # (made under a mode that the calls will not be under)
        return Check("applied", made, check, "is", True)

    try:
        with torch.inference_mode(False):
            examples = [torch.empty(shape, dtype=dt) for dt, shape in types]
            plain = guard(examples)
            wanting = (guard([e.requires_grad_() for e in examples])
                       if all(dt.is_floating_point for dt, _ in types) else None)
    except (TypeError, RuntimeError, ValueError):  # (another torch's TensorGuards)
        return None
    return None if plain is None else (plain, wanting)


def compiled_call(hot: HotCall):
    """``hot``'s call as one builtin of C (``backends.llvm.callentry``), or None: what its
    Python function checks and runs, in its order: what watches the call (``unwatched``,
    ``TILE_DEBUG``), each tensor's exact type, device, dtype, shape, contiguity, negative bit
    (``_guards``, or each read) and address, no two at one address; a gradient wanted:
    ``TileHotFunction``; else the outputs made as the lane makes them (``empty_like`` an input,
    or ``empty`` of a shape; ``zeros`` where the program needs them zeroed), and the lane's entry
    run where ``Lane.run`` would run it (its lock free, no general work queued or unwaited for).
    Anything else declines: to ``hot.call``, the Python path (which the builtin then replaces).
    None where the lane has no entry or runs otherwise (temporaries zeroed), or its executor's
    ``raw_ready`` is not the one read."""
    from backends.llvm.callentry import Arg, CallPlan, Check, Make, Out, call_entry
    from backends.llvm.raw import RawCalls

    lane, outputs = hot.lane.lane, []
    raw, ex = lane._entry, lane.executor
    if raw is None or lane._zero or type(ex).raw_ready is not RawCalls.raw_ready:
        return None
    for make, shape, dtype, device, like in hot.lane.outputs:
        if make is None:
            return None  # (an output that is an input: a backward's only)
        outputs.append(Make(make, torch.Tensor, (Arg(like),)) if like is not None
                       else Make(make, torch.Tensor, (tuple(shape),), ("dtype", "device"), (dtype, device)))
    before = [Check(read, obj, key, "is", value) for read, obj, key, value in unwatched()]
    before.append(Check("has", _ENVIRON, _DEBUG_KEY))
    guards = _guards(hot._types) if TENSOR_GUARDS else None
    for i, (dt, shape) in enumerate(hot._types):
        if guards is None:
            before += [_read(i, "is_cpu", "is", True), _read(i, "dtype", "is", dt),
                       _read(i, "shape", "eq", shape), _read(i, "is_contiguous", "is", True),
                       _read(i, "is_neg", "is", False)]
        before.append(_read(i, "data_ptr", "address"))
    after = (*[_read(Out(k), "data_ptr", "address") for k in range(len(outputs))],
             Check("cmethod", lane.program._lock, type(lane.program._lock).__dict__["locked"], "is", False),
             Check("attr", ex, "_queued", "is", 0),  # (``RawCalls.raw_ready``)
             Check("attr", lane.program, "_last", "false"))
    C = torch._C
    plan = CallPlan(len(hot._types), (PLAIN_TYPES,) * len(hot._types), tuple(before), tuple(outputs), after,
                    ctypes.cast(raw.sequence.fn, ctypes.c_void_p).value, tuple(lane._fixed), True,
                    (C.is_grad_enabled, C._any_requires_grad, _HOT_APPLY, hot), otherwise=hot.call,
                    guards=guards, keep=(raw,))
    return call_entry(plan)


def hot_backward(hot: HotCall, needs: tuple):
    """The backward's hot function for inputs needing a gradient as ``needs`` says
    (``ctx.needs_input_grad``): ``fast(ctx, grads)`` giving ``backward``'s tuple, or None for the
    general backward. None where none can be made (gradients not of their inputs' types, a lane
    not on the host), ``_MISSING`` where the general path has kept no lane for it yet."""
    op, sig = hot.op, hot.sig
    if hot.cuda is not None:
        return None
    wrt = tuple(i for i, (dt, _, _) in enumerate(sig) if needs[i + 1] and dt.is_floating_point)
    if not wrt:
        return None
    cpu = torch.device("cpu")  # (the cotangents' signature, as ``TorchOp._backward_at`` keys it)
    cot_sig = tuple((TO_TORCH[dtype.numpy], torch.Size(shape), cpu)
                    for shape, dtype in hot.lane.lane.output_types)
    lane = op._grad_lanes.get((wrt, sig, cot_sig), _MISSING)
    if lane is _MISSING or lane is None:
        return lane
    if not (lane.conform and lane.lane.executor.raw_host):
        return None
    types = hot._types + tuple((dt, shape) for dt, shape, _ in cot_sig)
    # (checked: the places the lane's kernels read or its gradients are; ``DX = DZ``: only DZ)
    reads = tuple(i in lane.lane.used for i in range(len(types)))
    n, m, check = len(sig), len(cot_sig), checker(types, reads, distinct=True)
    launch, places = lane.launcher(), tuple(i + 1 for i in wrt)
    every = places == tuple(range(1, n + 1))  # (every input's gradient: the usual)
    grad_on = torch._C.is_grad_enabled

    def fast(ctx, grads):
        # (grad mode on: ``create_graph``, a backward differentiated further: the general one)
        if len(grads) != m or grad_on() or watched() or debug_on():
            return None
        try:  # (``loss.sum().backward()``'s cotangent is one value broadcast, stride 0: copied
            # contiguous, as the general path would copy it)
            grads = [c if c is None or c.is_contiguous() else c.contiguous() for c in grads]
        except RuntimeError:  # (a sparse cotangent: the general path's)
            return None
        both = (*ctx.saved_tensors, *grads)  # (unpacked: an input changed in place is refused)
        pointers = check(both)
        if pointers is None:
            return None
        outs = launch(both, pointers)
        if outs is None:
            return None
        if every:
            return (None, *outs)
        result = [None] * (n + 1)
        for at, g in zip(places, outs):
            result[at] = g
        return tuple(result)
    return fast


class TileHotFunction(torch.autograd.Function):
    """``TileEagerFunction`` for a call ``HotCall.call`` checked: the forward's lane, the
    backward's where kept (``apply(hot, *tensors)``)."""

    @staticmethod
    def forward(ctx, hot, *tensors):
        ctx.hot = hot
        ctx.save_for_backward(*tensors)
        output = hot.forward(tensors)
        if hot.ints:
            outs = output if isinstance(output, tuple) else (output,)
            ctx.mark_non_differentiable(*[outs[i] for i in hot.ints])
        return output

    @staticmethod
    def backward(ctx, *grads):
        hot = ctx.hot
        found = hot.backward(ctx, grads)
        if found is not None:
            return found
        return backward_of(ctx, grads, hot.op, hot.sig)


_HOT_APPLY = c_apply(TileHotFunction) or TileHotFunction.apply
