"""A lane's native call as a Python builtin function (``raw.RawCalls.raw_entry``).

A small lane's run is mostly the cost of reaching its kernels: a ctypes call (argument conversion
through ``argtypes``, the GIL released and taken back) is ~0.5 us, the address table's fill from
Python ~0.1 us; a 1-element add's kernel runs in nanoseconds. ``raw_entry`` JIT-compiles, once per
lane, a CPython ``METH_FASTCALL`` function ``entry(*addresses)``: each argument converted by
``PyLong_AsVoidPtr`` into an array on its stack, the lane's fixed addresses (its temporaries)
after them, then one call of the lane's compiled kernel sequence (``sequence.raw_sequence``) on
that array. It returns True, or raises (``TypeError``: a wrong count; a non-integer argument:
``PyLong_AsVoidPtr``'s error). It holds the GIL while the kernels run, so it is made only for
lanes whose kernels do little work (``backends.lane.ENTRY_ELEMENTS``). The array is the call's
own; the sequence's tables are shared, and the lane's lock serializes calls, as for the sequence.

Only CPython's stable calling convention is used (``PyMethodDef``, ``METH_FASTCALL``,
``PyCFunction_NewEx``, ``PyLong_AsVoidPtr``, ``PyErr_Occurred``, ``PyBool_FromLong``,
``PyErr_SetString``); on another interpreter there is no entry (None) and the lane keeps its
ctypes call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llvmlite.binding as llvm

from backends.llvm.host import host_target, target_machine

METH_FASTCALL = 0x0080
NAME = "tile_lane_entry"
# PyCFunction_NewEx(PyMethodDef *, PyObject *self, PyObject *module) -> a new builtin
_NEW_FUNCTION = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.py_object)


class MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""

    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


def _api() -> dict[str, int] | None:
    """The addresses of the CPython functions the entry calls, or None (not CPython)."""
    api = getattr(ctypes, "pythonapi", None)
    names = ("PyLong_AsVoidPtr", "PyErr_Occurred", "PyBool_FromLong", "PyErr_SetString")
    try:
        found = {n: ctypes.cast(getattr(api, n), ctypes.c_void_p).value for n in names}
        found["PyExc_TypeError"] = ctypes.c_void_p.in_dll(api, "PyExc_TypeError").value
        found["PyCFunction_NewEx"] = _NEW_FUNCTION(("PyCFunction_NewEx", api))
    except (AttributeError, ValueError, TypeError):
        return None
    return found


def new_function(definition: int, owner=None):
    """A new builtin from the ``PyMethodDef`` at address ``definition``, holding ``owner`` (its
    ``self``: what keeps the definition and its code alive, as long as the builtin lives)."""
    return _NEW_FUNCTION(("PyCFunction_NewEx", ctypes.pythonapi))(definition, owner, None)


class Entry:
    """The builtin (``fn``) and what it runs on (the engine holding its code, the method
    definition it was made from, the sequence it calls): kept alive together."""

    __slots__ = ("fn", "engine", "definition", "sequence", "source")

    def __init__(self, fn, engine, definition, sequence, source: str):
        self.fn, self.engine, self.definition, self.sequence = fn, engine, definition, sequence
        self.source = source


def raw_entry(sequence, given: int, fixed: Sequence[int]) -> Entry | None:
    """The entry of ``sequence`` (a ``sequence.NativeSequence`` over ``given + len(fixed)``
    addresses): ``entry.fn(*addresses)`` with the ``given`` call addresses, ``fixed`` appended;
    None where this interpreter has no such calls."""
    api = _api()
    if api is None:
        return None
    count = given + len(fixed)
    run = ctypes.cast(sequence.fn, ctypes.c_void_p).value
    message = ctypes.create_string_buffer(f"a lane's entry takes {given} addresses".encode())
    i64 = "i64"
    lines = [
        f"define ptr @{NAME}(ptr %self, ptr %args, i64 %n) {{",
        "entry:",
        f"  %a = alloca [{max(1, count)} x i64], align 8",
        f"  %right = icmp eq i64 %n, {given}",
        "  br i1 %right, label %convert, label %wrong",
        "wrong:",
        f"  call void inttoptr ({i64} {api['PyErr_SetString']} to ptr)(ptr inttoptr ({i64} "
        f"{api['PyExc_TypeError']} to ptr), ptr inttoptr ({i64} {ctypes.addressof(message)} to ptr))",
        "  ret ptr null",
        "convert:",
    ]
    for i in range(given):
        lines += [
            f"  %q{i} = getelementptr inbounds ptr, ptr %args, i64 {i}",
            f"  %o{i} = load ptr, ptr %q{i}",
            f"  %v{i} = call ptr inttoptr ({i64} {api['PyLong_AsVoidPtr']} to ptr)(ptr %o{i})",
            f"  %p{i} = getelementptr inbounds i64, ptr %a, i64 {i}",
            f"  store ptr %v{i}, ptr %p{i}",
        ]
    for j, at in enumerate(fixed):
        lines += [f"  %f{j} = getelementptr inbounds i64, ptr %a, i64 {given + j}",
                  f"  store i64 {at}, ptr %f{j}"]
    lines += [
        f"  %err = call ptr inttoptr ({i64} {api['PyErr_Occurred']} to ptr)()",
        "  %bad = icmp ne ptr %err, null",
        "  br i1 %bad, label %failed, label %go",
        "failed:",
        "  ret ptr null",
        "go:",
        f"  call void inttoptr ({i64} {run} to ptr)(ptr %a)",
        f"  %true = call ptr inttoptr ({i64} {api['PyBool_FromLong']} to ptr)(i64 1)",
        "  ret ptr %true",
        "}",
    ]
    source = f'target triple = "{llvm.get_process_triple()}"\n' + "\n".join(lines) + "\n"
    mod = llvm.parse_assembly(source)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, target_machine(*host_target()))
    engine.finalize_object()
    definition = MethodDef(NAME.encode(), engine.get_function_address(NAME), METH_FASTCALL, None)
    fn = api["PyCFunction_NewEx"](ctypes.addressof(definition), None, None)
    return Entry(fn, engine, (definition, message), sequence, source)


__all__ = ["Entry", "MethodDef", "new_function", "raw_entry"]
