"""``python -m bench.torch_call_floor``: where a 1-element ``tile.torch`` call's time goes, and the
floor of any op written in Python (issue 39's CPU rows; one thread).

Each line is the minimum over rounds of this process's CPU time per call (a loaded machine's
waits do not count; the minimum is the cost without interference). Measured in one process:

* torch's own ``x + y`` and Tile's ``add(x, y)`` (the hot path, ``tile.torch_hot``: its call
  compiled to C, ``compiled_call``, once the lane has its entry);
* the compiled call alone, the Python function it replaced (its fallback), and its parts: builtins
  made from its plan (``backends.llvm.callentry``) with parts left out, each part's cost the
  difference (the addresses, ``empty_like`` and the kernel alone; what watches; the tensors'
  checks as Dynamo's ``TensorGuards`` or read one by one; the gradient's; the lane's lock,
  queue and events); the op's Python frame (the op's call less the builtin's);
* the Python hot path's pieces alone: the check for what watches a call, the checks of two
  tensors, ``torch.empty_like``, the lane's run, the kernel's call through its Python entry and
  through ctypes (the call it replaced);
* floors: the entry and ``empty_like`` with no check at all, and with every check of the hot path
  written inline in one function; a ``torch.autograd.Function`` and a ``torch.library.custom_op``
  that only return ``empty_like``;
* with a gradient: forward + ``sum().backward()`` of torch's add, Tile's, and of a Python
  ``autograd.Function`` that saves its inputs and returns the cotangent twice.

Every result is checked against torch's first.
"""

from __future__ import annotations

import ctypes
import time
import timeit

ADD = "function (A[N], B[N]) -> (C) { C = A + B; }"


def per_call(stmt, scope: dict, number: int, rounds: int = 30) -> float:
    """The minimum over ``rounds`` of the CPU time per call of ``stmt`` (us)."""
    times = timeit.repeat(stmt, globals=scope, number=number, repeat=rounds, timer=time.process_time)
    return min(times) / number * 1e6


def main() -> int:
    import torch

    import tile.torch as tt
    from backends.runner import debug_on
    from tile.torch_lane import watched

    torch.set_num_threads(1)
    add = tt.op(ADD, name="bench_floor_add", device="llvm_cpu.0", settings={"threads": 1})
    x, y = torch.ones(1), torch.full((1,), 2.0)
    for _ in range(50):  # (the lane's entry is built after its 8th call)
        assert torch.equal(add(x, y), x + y)
    hot = add._lanes[tt.signature((x, y))].hot
    lane = hot.lane.lane
    entry, lock, ex = lane._entry.fn, lane.program._lock, lane.executor
    kernel = lane.program.kernels[lane.program._order[0]]
    table = (ctypes.c_void_p * 3)(x.data_ptr(), y.data_ptr(), x.data_ptr())
    out = torch.empty(1)
    from tile.torch_hot import checker

    checks = checker(hot._types, distinct=True)
    tensor, d0, s0 = torch.Tensor, torch.float32, x.shape
    grad_on, any_grad, empty_like = torch._C.is_grad_enabled, torch._C._any_requires_grad, torch.empty_like

    def bare(a, b):  # the entry and the allocation, no check
        o = empty_like(a)
        entry(a.data_ptr(), b.data_ptr(), o.data_ptr())
        return o

    def inline(*tensors):  # every check of the hot path, written out in one function
        if len(tensors) != 2 or watched() or debug_on():
            return None
        try:
            a, b = tensors
            if (type(a) is not tensor or not a.is_cpu or a.dtype is not d0 or a.shape != s0
                    or not a.is_contiguous() or a.is_neg()
                    or type(b) is not tensor or not b.is_cpu or b.dtype is not d0 or b.shape != s0
                    or not b.is_contiguous() or b.is_neg()):
                return None
            pa, pb = a.data_ptr(), b.data_ptr()
        except RuntimeError:
            return None
        if not pa or not pb or pa == pb or grad_on() and any_grad(a, b):
            return None
        o = empty_like(a)
        with lock:
            if ex._queued:
                return None
            entry(pa, pb, o.data_ptr())
        return o

    class Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return torch.empty_like(a)

    def nothing_impl(a, b):
        return torch.empty_like(a)

    nothing = torch.library.custom_op("tile_bench::floor_nothing", nothing_impl, mutates_args=(),
                                      schema="(Tensor a, Tensor b) -> Tensor")

    class Passes(torch.autograd.Function):  # the least a Python-defined add's gradient can do
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            return g, g

    assert torch.equal(bare(x, y), x + y) and torch.equal(inline(x, y), x + y)
    entry(x.data_ptr(), y.data_ptr(), out.data_ptr())
    assert torch.equal(out, x + y)
    xg, yg = torch.ones(1, requires_grad=True), torch.full((1,), 2.0, requires_grad=True)
    add(xg, yg).sum().backward()
    assert torch.equal(xg.grad, torch.ones(1)) and torch.equal(yg.grad, torch.ones(1))
    addresses = (x.data_ptr(), y.data_ptr(), out.data_ptr())
    scope = dict(locals(), torch=torch)
    rows = [
        ("torch x + y", "x + y", 20000),
        ("Tile add(x, y) (the hot path: compiled, where it is)", "add(x, y)", 20000),
        ("  watched() (compile, modes, functorch, forward AD)", "watched()", 20000),
        ("  the checks of 2 tensors (unrolled)", "checks((x, y))", 20000),
        ("  torch.empty_like(x)", "empty_like(x)", 20000),
        ("  Lane.run (lock, queued work, the entry)", "lane.run(addresses)", 20000),
        ("  the kernel through its entry", "entry(*addresses)", 20000),
        ("  the kernel through ctypes (before)", "kernel.fn(table, 0, 1)", 20000),
        ("floor: empty_like + entry, no check", "bare(x, y)", 20000),
        ("floor: every check inline + empty_like + lock + entry", "inline(x, y)", 20000),
        ("Python autograd.Function returning empty_like", "Nothing.apply(x, y)", 20000),
        ("torch.library.custom_op returning empty_like", "nothing(x, y)", 10000),
        ("torch add + sum().backward()", "(xg + yg).sum().backward()", 2000),
        ("Tile add + sum().backward()", "add(xg, yg).sum().backward()", 2000),
        ("Python Function (saves, returns g, g) + backward", "Passes.apply(xg, yg).sum().backward()", 2000),
    ]
    print(f"{'CPU us per call (min of 30 rounds)':60} {'us':>7}")
    for name, stmt, number in rows[:2] + compiled_rows(hot, x, y, scope) + rows[2:]:
        print(f"{name:60} {per_call(stmt, scope, number):7.3f}", flush=True)
    return 0


def compiled_rows(hot, x, y, scope: dict) -> list[tuple[str, str, int]]:
    """The compiled call's rows (``main``'s docstring), its variants put in ``scope``; none where
    this tree or interpreter compiles no call."""
    entry = getattr(hot, "entry", None)
    if entry is None:
        return []
    import dataclasses

    from backends.llvm.callentry import call_entry
    from tile.torch_hot import TENSOR_GUARDS, compiled_call

    plan, args = entry.plan, (x, y)
    addresses = tuple(c for c in plan.before if c.want == "address")
    watching = tuple(c for c in plan.before if c.want != "address" and not hasattr(c.obj, "place"))
    reads = tuple(c for c in plan.before if hasattr(c.obj, "place") and c.want != "address")
    import tile.torch_hot as hot_module

    hot_module.TENSOR_GUARDS = not TENSOR_GUARDS  # (the other tensor route's plan)
    other = compiled_call(hot).plan
    hot_module.TENSOR_GUARDS = TENSOR_GUARDS
    read_one_by_one = tuple(c for c in other.before if hasattr(c.obj, "place") and c.want != "address")
    bare = dataclasses.replace(plan, before=addresses, after=plan.after[:1], grad=None, guards=None,
                               otherwise=None)
    variants = {
        "bare": bare,
        "watch": dataclasses.replace(bare, before=watching + addresses),
        "guards": dataclasses.replace(bare, guards=plan.guards and (plan.guards[0], None)),
        "reads": dataclasses.replace(bare, before=(reads or read_one_by_one) + addresses),
        "grad": dataclasses.replace(bare, grad=other.grad),
        "lane": dataclasses.replace(bare, after=plan.after),
    }
    scope["compiled"] = {k: call_entry(v).fn for k, v in variants.items()}
    scope.update(args=args, whole=entry.fn, python_call=plan.otherwise)
    for fn in scope["compiled"].values():
        assert fn(args) is not None and bool((fn(args) == x + y).all())
    rows = [
        ("  the compiled call alone", "whole(args)", 20000),
        ("  the Python hot call it replaced (its fallback)", "python_call(args)", 20000),
        ("  C: addresses + empty_like + the kernel (bare)", "compiled['bare'](args)", 20000),
        ("  C: bare + what watches (7 reads)", "compiled['watch'](args)", 20000),
        ("  C: bare + the gradient's check (is_grad_enabled, any)", "compiled['grad'](args)", 20000),
        ("  C: bare + the lane's lock, queue, events", "compiled['lane'](args)", 20000),
        ("  C: bare + 2 tensors read one by one (10 reads)", "compiled['reads'](args)", 20000),
    ]
    if plan.guards is not None:
        rows.append(("  C: bare + 2 tensors' TensorGuards check", "compiled['guards'](args)", 20000))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
