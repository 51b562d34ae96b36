"""A framework op's whole checked call as one JIT-compiled CPython builtin (``call_entry``).

``pyentry.raw_entry`` made a lane's kernels a builtin taking addresses; what is left of a small
``tile.torch`` call is the Python that checks it may take the lane (what watches the call, each
tensor's type, device, dtype, shape, layout and address), makes its output and calls the entry:
~2 us of a 1-element add's 3.4 (torch's whole add: ~1.1). ``call_entry`` compiles that checking
too: a ``METH_O`` builtin ``entry(args)`` (``args`` a tuple) that evaluates a ``CallPlan``, data
made by the caller (``tile.torch_hot``), through CPython's C API:

* ``before``: each ``Check`` (a value read: a zero-argument call, a dict's item or key, an
  attribute, a method called with no argument or on the call's tuple; on an object or on one of
  the arguments; torch's getters and methods through their C functions) and what it must be (that
  object, equal to a value, false, or a nonzero address, recorded for the kernels); the
  arguments' exact types; their addresses pairwise distinct (``distinct``);
* ``grad``: where ``on()`` is True and ``any(*args)`` too, ``apply(first, *args)``'s result is the
  call's (its errors too), as the Python path hands such a call to an ``autograd.Function``; or
  ``guards``, two checks of the whole tuple: the first passing, the plain call; else the second
  passing, ``apply`` where ``on()`` is True;
* ``outputs``, each made (``Make``: e.g. ``empty_like(args[i])``), then ``after``'s checks (on
  them: their addresses; on the lane: nothing holds its lock, no work queued), then the lane's
  kernel sequence on the addresses; the output returned, or the outputs as a tuple.

Any check not passing, or raising, declines: no error set, nothing run (the output made is
dropped), and the tuple handed to ``otherwise`` (the caller's Python path, which decides the call
as before), or None returned.

Threads: from ``after``'s lane checks (its lock free, nothing queued, nothing unwaited for: reads
of existing objects, after the output's address) to the kernels' end, nothing is allocated (so no
collection runs finalizers), no Python code runs and the GIL is not released (the kernels are
native code calling nothing), so no other thread runs in between: none can take the lock or
queue work there, and finding it free is holding it. The checks before may release the GIL
(torch's bindings do), as the Python path's do: they decide only the arguments.

Layout facts used (checked against the running interpreter first, else no entry): an object's
type at offset 8, a tuple's size at 16 and its items from 24 (CPython, 64-bit, not a debug build,
with a GIL); a builtin function's and a descriptor's definitions where CPython keeps them
(``_cfunction``, ``_descriptor``: checked against the object's own name and class).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field

import llvmlite.binding as llvm

from backends.llvm.host import host_target, target_machine

NAME = "tile_call_entry"
METH_O = 0x0008
OFFSET = 1 << 63  # PY_VECTORCALL_ARGUMENTS_OFFSET: args[-1] may be used by the callee
_API = ("PyObject_CallNoArgs", "PyTuple_New", "PyObject_Vectorcall", "PyObject_VectorcallMethod",
        "PyObject_GetAttr", "PyDict_GetItem", "PyDict_Contains", "PyObject_RichCompareBool",
        "PyObject_IsTrue", "PyLong_AsVoidPtr", "Py_IncRef", "Py_DecRef", "PyErr_Clear")


@dataclass(frozen=True)
class Arg:
    """The call's argument at ``place`` (in ``Check.obj``)."""

    place: int


@dataclass(frozen=True)
class Out:
    """The call's output ``place`` (in ``Check.obj``; ``CallPlan.after`` only)."""

    place: int


OUT = Out(0)  # (the one output of a call of one)


@dataclass(frozen=True)
class Make:
    """How an output is made: ``fn(*args, **dict(zip(kwnames, kwvalues)))``, an ``Arg`` in
    ``args`` standing for that argument of the call; of exactly ``type`` (else declined)."""

    fn: object
    type: type
    args: tuple = ()
    kwnames: tuple[str, ...] = ()
    kwvalues: tuple = ()


@dataclass(frozen=True)
class Check:
    """``read`` of ``obj`` (an object, ``Arg(i)`` or ``Out(k)``) with ``key``: ``call`` (``obj()``),
    ``item`` (``obj[key]``, a dict; missing fails), ``has`` (``key in obj``, a dict: must be
    absent), ``attr`` (``obj.key``), ``method`` (``obj.key()``); or, ``key`` a descriptor of
    ``obj``'s class called through its C function, ``get`` (a getset's getter), ``cmethod`` (a
    method, no argument), ``applied`` (a method, on the call's own tuple); and what the value must be,
    ``want``: ``is`` (``value`` itself), ``eq`` (``== value``), ``false``, or ``address`` (a
    nonzero integer: the argument's, or the output's, address for the kernels)."""

    read: str
    obj: object
    key: object = None
    want: str = "is"
    value: object = None


@dataclass(frozen=True)
class CallPlan:
    """What ``call_entry``'s builtin checks and runs (the module's docstring): ``count``
    arguments of ``types`` (per argument, the exact types it may have), ``sequence`` (the address
    of a lane's native call on an address table: the arguments', the outputs', then ``fixed``)."""

    count: int
    types: tuple[tuple[type, ...], ...]
    before: tuple[Check, ...]
    outputs: tuple[Make, ...]  # (one: returned as it is; several: as a tuple)
    after: tuple[Check, ...]
    sequence: int
    fixed: tuple[int, ...] = ()
    distinct: bool = True
    grad: tuple | None = None  # (on, any, apply, first)
    otherwise: object = None  # what a declined call's tuple is handed to (None: None returned)
    # (plain, wanting): checks of the whole tuple (``applied``) in place of ``grad``'s ``any``:
    # ``plain`` passing, the plain call; else ``wanting`` passing, ``apply`` where ``on()``
    guards: tuple | None = None
    keep: tuple = field(default=(), compare=False)  # what the sequence's code lives in


class CallEntry:
    """The builtin (``fn``) and everything its code points at, kept alive with it."""

    __slots__ = ("fn", "plan", "source", "_keep")

    def __init__(self, fn, plan: CallPlan, source: str, keep: list):
        self.fn, self.plan, self.source, self._keep = fn, plan, source, keep


def _layout_holds() -> bool:
    """Whether this interpreter lays objects and tuples out as the entry reads them."""
    if sys.implementation.name != "cpython" or hasattr(sys, "gettotalrefcount") or sys.maxsize != 2**63 - 1:
        return False
    if not getattr(sys, "_is_gil_enabled", lambda: True)():  # (free-threaded: the lock argument fails)
        return False
    probe = (object(), object())
    word = ctypes.c_void_p.from_address
    size = ctypes.c_ssize_t.from_address(id(probe) + 16).value
    return (word(id(probe) + 8).value == id(tuple) and size == 2
            and word(id(probe) + 24).value == id(probe[0]) and word(id(probe) + 32).value == id(probe[1]))


def _api() -> dict[str, int] | None:
    api = getattr(ctypes, "pythonapi", None)
    try:
        return {n: ctypes.cast(getattr(api, n), ctypes.c_void_p).value for n in _API}
    except (AttributeError, ValueError, TypeError):
        return None


class _Writer:
    """LLVM IR for one entry: fresh names, calls by address, branches to ``decline``."""

    def __init__(self, api: dict[str, int], keep: list):
        self.api, self.keep, self.lines, self.n = api, keep, [], 0
        self.types: tuple = ()  # (the plan's: what each argument may be)
        self.outputs: tuple = ()  # (the plan's ``Make``s)

    def name(self, stem: str = "v") -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def obj(self, o) -> str:
        """A constant pointer to ``o`` (kept alive with the entry)."""
        self.keep.append(o)
        return f"inttoptr (i64 {id(o)} to ptr)"

    def call(self, fn: str, *args: str, ret: str = "ptr") -> str:
        r = "%" + self.name()
        assign = "" if ret == "void" else f"{r} = "
        self.lines.append(f"  {assign}call {ret} inttoptr (i64 {self.api[fn]} to ptr)({', '.join(args)})")
        return r

    def call_at(self, address: int, *args: str) -> str:
        r = "%" + self.name()
        self.lines.append(f"  {r} = call ptr inttoptr (i64 {address} to ptr)({', '.join(args)})")
        return r

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def unless(self, cond: str, fail: str) -> None:
        """Go on where ``cond`` (an i1) holds, else to ``fail``."""
        ok = self.name("ok")
        self.emit(f"  br i1 {cond}, label %{ok}, label %{fail}")
        self.emit(f"{ok}:")

    def icmp(self, op: str, a: str, b: str, ty: str = "ptr") -> str:
        r = "%" + self.name("c")
        self.emit(f"  {r} = icmp {op} {ty} {a}, {b}")
        return r


def call_entry(plan: CallPlan) -> CallEntry | None:
    """The builtin of ``plan``, or None where this interpreter has no such calls."""
    api = _api()
    if api is None or not _layout_holds():
        return None
    keep: list = [plan]
    w = _Writer(api, keep)
    w.types, w.outputs = plan.types, plan.outputs
    n, m = plan.count, len(plan.outputs)
    slots = n + m + len(plan.fixed)
    width = max([n + 1, *[len(o.args) + len(o.kwvalues) for o in plan.outputs]]) + 1
    w.emit(f"define ptr @{NAME}(ptr %self, ptr %args) {{")
    w.emit("entry:")
    w.emit(f"  %table = alloca [{slots} x i64], align 8")
    w.emit(f"  %scratch = alloca [{width} x ptr], align 8")  # (slot 0: the vectorcall offset's)
    w.emit("  %vec = getelementptr inbounds ptr, ptr %scratch, i64 1")
    w.emit("  %typeat = getelementptr inbounds i8, ptr %args, i64 8")
    w.emit("  %type = load ptr, ptr %typeat")
    w.unless(w.icmp("eq", "%type", w.obj(tuple)), "decline")
    w.emit("  %sizeat = getelementptr inbounds i8, ptr %args, i64 16")
    w.emit("  %size = load i64, ptr %sizeat")
    w.unless(w.icmp("eq", "%size", str(n), "i64"), "decline")
    w.emit("  %items = getelementptr inbounds i8, ptr %args, i64 24")
    for i in range(n):
        w.emit(f"  %ata{i} = getelementptr inbounds ptr, ptr %items, i64 {i}")
        w.emit(f"  %a{i} = load ptr, ptr %ata{i}")
        w.emit(f"  %tya{i} = getelementptr inbounds i8, ptr %a{i}, i64 8")
        w.emit(f"  %ty{i} = load ptr, ptr %tya{i}")
        conds = [w.icmp("eq", f"%ty{i}", w.obj(t)) for t in plan.types[i]]
        cond = conds[0]
        for c in conds[1:]:
            r = "%" + w.name("or")
            w.emit(f"  {r} = or i1 {cond}, {c}")
            cond = r
        w.unless(cond, "decline")
    addresses: dict = {}
    for check in plan.before:
        _check(w, check, "decline", addresses, {})
    if plan.distinct:
        places = sorted(p for p in addresses if isinstance(p, int))
        for k, i in enumerate(places):
            for j in places[k + 1:]:
                w.unless(w.icmp("ne", addresses[i], addresses[j], "i64"), "decline")
    if plan.guards is not None:
        _guarded(w, plan, n, addresses)
    elif plan.grad is not None:
        _grad(w, plan, n)
    outs: dict[Out, str] = {}  # (each made output's value; a failure after it drops it and those before)
    for k, make in enumerate(plan.outputs):
        outs[Out(k)] = out = _made(w, make, f"dropped{k - 1}" if k else "decline")
        w.unless(w.icmp("ne", out, "null"), f"dropped{k - 1}" if k else "decline")
        w.emit(f"  %otya{k} = getelementptr inbounds i8, ptr {out}, i64 8")
        w.emit(f"  %oty{k} = load ptr, ptr %otya{k}")
        w.unless(w.icmp("eq", f"%oty{k}", w.obj(make.type)), f"dropped{k}")
    dropped = f"dropped{m - 1}"
    if m > 1:  # (the outputs' tuple, made before the lane's checks: it allocates)
        result = w.call("PyTuple_New", f"i64 {m}")
        w.unless(w.icmp("ne", result, "null"), dropped)
        dropped = "droppedtuple"
    for check in plan.after:
        _check(w, check, dropped, addresses, outs)
    for place, value in [*addresses.items()]:
        at = n + place.place if isinstance(place, Out) else place
        w.emit(f"  %slot{at} = getelementptr inbounds i64, ptr %table, i64 {at}")
        w.emit(f"  store i64 {value}, ptr %slot{at}")
    for j, value in enumerate(plan.fixed):
        w.emit(f"  %fixed{j} = getelementptr inbounds i64, ptr %table, i64 {n + m + j}")
        w.emit(f"  store i64 {value}, ptr %fixed{j}")
    w.emit(f"  call void inttoptr (i64 {plan.sequence} to ptr)(ptr %table)")
    if m == 1:
        w.emit(f"  ret ptr {outs[OUT]}")
    else:
        for k in range(m):  # (PyTuple_SET_ITEM: the tuple takes each output's reference)
            w.emit(f"  %item{k} = getelementptr inbounds i8, ptr {result}, i64 {24 + 8 * k}")
            w.emit(f"  store ptr {outs[Out(k)]}, ptr %item{k}")
        w.emit(f"  ret ptr {result}")
    if m > 1:
        w.emit("droppedtuple:")  # (its items still NULL: nothing but the tuple freed)
        w.call("Py_DecRef", f"ptr {result}", ret="void")
        w.emit(f"  br label %dropped{m - 1}")
    for k in reversed(range(m)):
        w.emit(f"dropped{k}:")
        w.call("Py_DecRef", f"ptr {outs[Out(k)]}", ret="void")
        w.emit(f"  br label %{f'dropped{k - 1}' if k else 'decline'}")
    w.emit("decline:")
    w.call("PyErr_Clear", ret="void")
    if plan.otherwise is None:
        w.call("Py_IncRef", f"ptr {w.obj(None)}", ret="void")
        w.emit(f"  ret ptr {w.obj(None)}")
    else:  # (the Python path's function, on the same tuple: its result, or its error)
        w.emit("  store ptr %args, ptr %vec")
        other = w.call("PyObject_Vectorcall", f"ptr {w.obj(plan.otherwise)}", "ptr %vec", f"i64 {1 | OFFSET}",
                       "ptr null")
        w.emit(f"  ret ptr {other}")
    w.emit("}")
    if set(addresses) != {*range(n), *outs}:
        raise ValueError("a call plan gives an address for each argument and each output")
    source = f'target triple = "{llvm.get_process_triple()}"\n' + "\n".join(w.lines) + "\n"
    return _compiled(source, plan, keep)


def _made(w: _Writer, make: Make, fail: str) -> str:
    """The output ``make`` makes (a new reference, or NULL with an error set)."""
    values = [*make.args, *make.kwvalues]
    for j, v in enumerate(values):
        w.emit(f"  %mk{w.n}_{j} = getelementptr inbounds ptr, ptr %vec, i64 {j}")
        w.emit(f"  store ptr {f'%a{v.place}' if isinstance(v, Arg) else w.obj(v)}, ptr %mk{w.n}_{j}")
    names = f"ptr {w.obj(tuple(make.kwnames))}" if make.kwnames else "ptr null"
    return w.call("PyObject_Vectorcall", f"ptr {w.obj(make.fn)}", "ptr %vec",
                  f"i64 {len(make.args) | OFFSET}", names)


def _fits(w: _Writer, check: Check) -> None:
    """Refuse a descriptor read of an object not of its class (its C function would read it
    wrong): each type the argument may have, or the object itself, checked here."""
    owner = getattr(check.key, "__objclass__", None)
    obj = check.obj
    types = (w.types[obj.place] if isinstance(obj, Arg) else (w.outputs[obj.place].type,)
             if isinstance(obj, Out) else (type(obj),))
    if owner is None or not all(issubclass(t, owner) for t in types):
        raise ValueError(f"{check.key!r} is not a descriptor of every type {check.read} reads it on")


def _value(w: _Writer, check: Check, outs: dict) -> tuple[str, bool]:
    """The value ``check`` reads, and whether it is a new reference (else borrowed)."""
    obj = check.obj
    target = (f"%a{obj.place}" if isinstance(obj, Arg) else outs[obj] if isinstance(obj, Out) else w.obj(obj))
    if check.read == "call":
        direct = _cfunction(obj)
        if direct is not None and direct[1] == METH_NOARGS:  # (its C function: no vectorcall)
            w.keep.append(obj)
            return w.call_at(direct[0], f"ptr inttoptr (i64 {direct[2]} to ptr)", "ptr null"), True
        return w.call("PyObject_CallNoArgs", f"ptr {target}"), True
    key = w.obj(sys.intern(check.key) if isinstance(check.key, str) else check.key)
    if check.read == "item":
        return w.call("PyDict_GetItem", f"ptr {target}", f"ptr {key}"), False
    if check.read == "has":
        return w.call("PyDict_Contains", f"ptr {target}", f"ptr {key}", ret="i32"), False
    if check.read == "attr":
        return w.call("PyObject_GetAttr", f"ptr {target}", f"ptr {key}"), True
    if check.read in ("get", "cmethod", "applied"):
        _fits(w, check)
    if check.read == "get":  # (the getter of a getset descriptor, called directly)
        get, closure = _getter(check.key)
        return w.call_at(get, f"ptr {target}", f"ptr inttoptr (i64 {closure} to ptr)"), True
    if check.read == "cmethod":  # (a method descriptor's C function, called directly)
        meth, flags = _method(check.key)
        second = f"ptr {w.obj(())}" if flags & METH_VARARGS else "ptr null"
        extra = ["ptr null"] if flags & METH_KEYWORDS else []
        return w.call_at(meth, f"ptr {target}", second, *extra), True
    if check.read == "applied":  # (a method's C function on the call's own tuple: none made)
        meth, flags = _method(check.key, METH_VARARGS | METH_KEYWORDS)
        return w.call_at(meth, f"ptr {target}", "ptr %args", "ptr null"), True
    if check.read == "method":
        w.emit(f"  store ptr {target}, ptr %vec")
        called = w.call("PyObject_VectorcallMethod", f"ptr {key}", "ptr %vec", f"i64 {1 | OFFSET}",
                        "ptr null")
        return called, True
    raise ValueError(f"a check reads by call, item, has, attr or method, not {check.read!r}")


METH_VARARGS, METH_KEYWORDS, METH_NOARGS = 0x1, 0x2, 0x4
_WORD = ctypes.c_void_p.from_address


def _descriptor(d, kind: type) -> int:
    """The address of ``d``'s definition (``PyGetSetDef``/``PyMethodDef``): after the common
    descriptor head (object head, ``d_type``, ``d_name``, ``d_qualname``), checked to be that."""
    if type(d) is not kind or _WORD(id(d) + 16).value != id(d.__objclass__) or _WORD(
            id(d) + 24).value != id(d.__name__):
        raise ValueError(f"{d!r} is not a {kind.__name__} laid out as CPython's")
    return _WORD(id(d) + 40).value


def _cfunction(f) -> tuple[int, int, int] | None:
    """``(ml_meth, ml_flags, m_self)`` of a builtin function (``PyCFunctionObject``: object head,
    ``m_ml``, ``m_self``), checked to be laid out so; None for any other callable."""
    if type(f) is not type(len) or f.__self__ is None or _WORD(id(f) + 24).value != id(f.__self__):
        return None
    definition = _WORD(id(f) + 16).value
    if ctypes.c_char_p.from_address(definition).value != f.__name__.encode():
        return None
    return _WORD(definition + 8).value, ctypes.c_int.from_address(definition + 16).value, id(f.__self__)


def _getter(d) -> tuple[int, int]:
    """``(get, closure)`` of a getset descriptor (``PyGetSetDef``: name, get, set, doc, closure)."""
    definition = _descriptor(d, type(type.__dict__["__name__"]))
    return _WORD(definition + 8).value, _WORD(definition + 32).value or 0


def _method(d, only: int | None = None) -> tuple[int, int]:
    """``(ml_meth, ml_flags)`` of a method descriptor called with no argument (or, ``only``, of
    those flags alone)."""
    definition = _descriptor(d, type(str.join))
    flags = ctypes.c_int.from_address(definition + 16).value
    if flags not in ((METH_NOARGS, METH_VARARGS, METH_VARARGS | METH_KEYWORDS) if only is None else (only,)):
        raise ValueError(f"{d!r} is not called as METH_NOARGS or METH_VARARGS (flags {flags:#x})")
    return _WORD(definition + 8).value, flags


def _check(w: _Writer, check: Check, fail: str, addresses: dict, outs: dict) -> None:
    value, new = _value(w, check, outs)
    if check.read == "has":
        w.unless(w.icmp("eq", value, "0", "i32"), fail)
        return
    if check.want == "is":
        same = w.icmp("eq", value, w.obj(check.value))
        if new:
            w.call("Py_DecRef", f"ptr {value}", ret="void")  # (Py_XDECREF: NULL is nothing)
        w.unless(same, fail)
        return
    w.unless(w.icmp("ne", value, "null"), fail)
    if check.want == "eq":
        result = w.call("PyObject_RichCompareBool", f"ptr {value}", f"ptr {w.obj(check.value)}", "i32 2",
                        ret="i32")
        ok = w.icmp("eq", result, "1", "i32")
    elif check.want == "false":
        ok = w.icmp("eq", w.call("PyObject_IsTrue", f"ptr {value}", ret="i32"), "0", "i32")
    elif check.want == "address":
        p = w.call("PyLong_AsVoidPtr", f"ptr {value}")
        at = "%" + w.name("p")
        w.emit(f"  {at} = ptrtoint ptr {p} to i64")
        ok = w.icmp("ne", at, "0", "i64")  # (0: no memory, or not an integer: an error, cleared)
        place = check.obj if isinstance(check.obj, Out) else check.obj.place
        if place in addresses:
            raise ValueError(f"a call plan gives {place}'s address twice")
        addresses[place] = at
    else:
        raise ValueError(f"a check wants is, eq, false or address, not {check.want!r}")
    if new:
        w.call("Py_DecRef", f"ptr {value}", ret="void")
    w.unless(ok, fail)


def _grad(w: _Writer, plan: CallPlan, n: int) -> None:
    """``on()`` True and ``any(*args)`` True: ``apply(first, *args)``'s result is the call's; both
    False-or-``on`` False: on to the plain call; anything else declines."""
    on, any_, apply, first = plan.grad
    for stem, value in (("on", w.call("PyObject_CallNoArgs", f"ptr {w.obj(on)}")),
                        ("any", None)):
        direct = _cfunction(any_)
        if value is None and direct is not None and direct[1] == METH_VARARGS | METH_KEYWORDS:
            w.keep.append(any_)  # (called with the call's own tuple: none made)
            value = w.call_at(direct[0], f"ptr inttoptr (i64 {direct[2]} to ptr)", "ptr %args", "ptr null")
        elif value is None:
            value = w.call("PyObject_Vectorcall", f"ptr {w.obj(any_)}", "ptr %items", f"i64 {n}", "ptr null")
        yes, no = w.icmp("eq", value, w.obj(True)), w.icmp("eq", value, w.obj(False))
        w.call("Py_DecRef", f"ptr {value}", ret="void")
        if stem == "on":
            w.emit(f"  br i1 {no}, label %plain, label %on")
            w.emit("on:")
            w.unless(yes, "decline")
        else:
            w.emit(f"  br i1 {no}, label %plain, label %any")
            w.emit("any:")
            w.unless(yes, "decline")
    _applied(w, apply, first, n)
    w.emit("plain:")


def _guarded(w: _Writer, plan: CallPlan, n: int, addresses: dict) -> None:
    """``plan.guards``: the plain check passing, on to the plain call; else the wanting one
    passing, ``grad``'s ``apply`` where ``on()`` is True, the plain call where False."""
    plain, wanting = plan.guards
    _check(w, plain, "wanting", addresses, {})
    w.emit("  br label %plain")
    w.emit("wanting:")
    if wanting is None or plan.grad is None:
        w.emit("  br label %decline")
    else:
        _check(w, wanting, "decline", addresses, {})
        on, _, apply, first = plan.grad
        value = w.call("PyObject_CallNoArgs", f"ptr {w.obj(on)}")
        yes, no = w.icmp("eq", value, w.obj(True)), w.icmp("eq", value, w.obj(False))
        w.call("Py_DecRef", f"ptr {value}", ret="void")
        w.emit(f"  br i1 {no}, label %plain, label %on")
        w.emit("on:")
        w.unless(yes, "decline")
        _applied(w, apply, first, n)
    w.emit("plain:")


def _applied(w: _Writer, apply, first, n: int) -> None:
    """Return ``apply(first, *args)`` (NULL: its error, raised)."""
    w.emit(f"  store ptr {w.obj(first)}, ptr %vec")
    for i in range(n):
        w.emit(f"  %va{i} = getelementptr inbounds ptr, ptr %vec, i64 {i + 1}")
        w.emit(f"  store ptr %a{i}, ptr %va{i}")
    result = w.call("PyObject_Vectorcall", f"ptr {w.obj(apply)}", "ptr %vec", f"i64 {(n + 1) | OFFSET}",
                    "ptr null")
    w.emit(f"  ret ptr {result}")


def _compiled(source: str, plan: CallPlan, keep: list) -> CallEntry:
    from backends.llvm.pyentry import MethodDef, new_function  # (one way of making builtins)

    mod = llvm.parse_assembly(source)
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, target_machine(*host_target()))
    engine.finalize_object()
    definition = MethodDef(NAME.encode(), engine.get_function_address(NAME), METH_O, None)
    keep += [engine, definition]
    fn = new_function(ctypes.addressof(definition), keep)  # (its ``self``: alive while it is)
    return CallEntry(fn, plan, source, keep)


__all__ = ["OUT", "Arg", "CallEntry", "CallPlan", "Check", "Make", "Out", "call_entry"]
