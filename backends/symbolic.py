"""Integers a shape-generic kernel reads at run time: ``Slot``s in a Stripe template.

Two Stripe kernels that differ only in some integers (an extent, a stride, a bound: the same
program at two sequence lengths) *unify* into a template: the kernel with each differing integer
replaced by a ``Slot(k)``. The LLVM code generator emits a slot as the k-th i64 of the kernel's
extents array (``backends.llvm.codegen.KernelCodegen.num``), the C-like one as the kernel's k-th
``long`` argument (``backends.clike.generic``); ``bind`` checks that another kernel is the template with
integers in the slots and reads those integers off it, which is all binding a new shape in a known
bucket costs. A slot refuses every use as a number (comparison, arithmetic, ``int``, truth,
hashing): a code generator decision that would read one raises ``SlotUsed`` instead of silently
baking one shape's value into code meant for all of them; the caller then builds the kernel
specialized. Block names and comments (which carry shapes) are not compared.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from fractions import Fraction

_IGNORED = {"name", "comments"}  # a Block's: labels only, they carry the shapes


class SlotUsed(TypeError):
    """A code generator decision read a run-time integer as if it were known."""


class Slot:
    """The k-th run-time integer of a generic kernel."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k

    def __repr__(self) -> str:
        return f"$n{self.k}"

    def _refuse(self, *_args):
        raise SlotUsed(f"run-time integer {self!r} used as a known number")

    __int__ = __index__ = __float__ = __bool__ = __hash__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __floordiv__ = __rfloordiv__ = __truediv__ = __rtruediv__ = __mod__ = __rmod__ = _refuse
    __neg__ = __abs__ = __pos__ = _refuse

    @property
    def denominator(self):  # Fraction-like use (Affine.is_integral) is a decision too
        return self._refuse()

    @property
    def numerator(self):
        return self._refuse()


def _integer(x) -> bool:
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, Fraction) and x.denominator == 1)


def _fields(x):
    return [f.name for f in dataclasses.fields(x) if not (f.name in _IGNORED and type(x).__name__ == "Block")]


def _rebuilt(x, values: dict):
    out = type(x).__new__(type(x))
    for f in dataclasses.fields(x):
        object.__setattr__(out, f.name, values.get(f.name, getattr(x, f.name)))
    return out


class _Mismatch(Exception):
    pass


def unify(a, b, counter: list[int] | None = None):
    """The template of ``a`` and ``b`` (``a`` may be a template already: its slots stay), or None
    when they differ in anything but integers."""
    counter = counter if counter is not None else [_max_slot(a) + 1]
    try:
        return _unify(a, b, counter)
    except _Mismatch:
        return None


def _unify(a, b, counter):
    if type(a) is Slot:
        if not _integer(b):
            raise _Mismatch
        return a
    if _integer(a) and _integer(b):
        if a == b and type(a) is type(b):
            return a
        counter[0] += 1
        return Slot(counter[0] - 1)
    if type(a) is not type(b):
        raise _Mismatch
    if isinstance(a, tuple):
        if len(a) != len(b):
            raise _Mismatch
        return tuple(_unify(x, y, counter) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        new = {}
        for name in _fields(a):
            x, y = getattr(a, name), getattr(b, name)
            z = _unify(x, y, counter)
            if z is not x:
                new[name] = z
        return _rebuilt(a, new) if new else a
    if isinstance(a, (str, float, bool, Enum, frozenset, type(None))) or type(a).__module__ == "tile.dtypes":
        if a != b:
            raise _Mismatch
        return a
    if a is b:
        return a
    raise _Mismatch  # an object we cannot compare structurally (a plan): no template


def bind(template, concrete) -> list[int] | None:
    """The integers ``concrete`` holds in ``template``'s slots (slot k at index k), or None when
    ``concrete`` is not an instance of ``template``."""
    values: dict[int, int] = {}
    try:
        _bind(template, concrete, values)
    except _Mismatch:
        return None
    if sorted(values) != list(range(len(values))):
        return None
    return [values[k] for k in range(len(values))]


def _bind(t, c, values: dict[int, int]) -> None:
    if type(t) is Slot:
        if not _integer(c) or values.setdefault(t.k, int(c)) != int(c):  # (a slot ``merged`` from
            raise _Mismatch  # several places takes one integer in all of them)
        return
    if _integer(t):
        if not (_integer(c) and t == c and type(t) is type(c)):
            raise _Mismatch
        return
    if type(t) is not type(c):
        raise _Mismatch
    if isinstance(t, tuple):
        if len(t) != len(c):
            raise _Mismatch
        for x, y in zip(t, c):
            _bind(x, y, values)
        return
    if dataclasses.is_dataclass(t) and not isinstance(t, type):
        for name in _fields(t):
            _bind(getattr(t, name), getattr(c, name), values)
        return
    if t is c:
        return
    if isinstance(t, (str, float, bool, Enum, frozenset, type(None))) or type(t).__module__ == "tile.dtypes":
        if t != c:
            raise _Mismatch
        return
    raise _Mismatch


def erased(x) -> str:
    """``x`` with every integer written ``#``: equal for all instances of one template (a key)."""
    return flat(x)[0]


def flat(x) -> tuple[str, list]:
    """``erased(x)`` and what it wrote ``#`` for, in order (integers; a template's slots too): two
    kernels of the same erased text differ only there, so ``matches`` binds one to the other's
    template from these lists, without walking both trees again (``bind``)."""
    out: list[str] = []
    ints: list = []
    _erase(x, out, ints)
    return "".join(out), ints


def matches(pattern: list, ints: list) -> list[int] | None:
    """``bind`` from ``flat``'s lists of a template (``pattern``) and a kernel of the same erased
    text (``ints``): the integers in the slots, or None where the kernel differs from an integer
    the template fixed."""
    if len(pattern) != len(ints):
        return None
    values: dict[int, int] = {}
    for t, c in zip(pattern, ints):
        if type(t) is Slot:
            if type(c) is Slot or values.setdefault(t.k, int(c)) != int(c):
                return None
        elif type(c) is Slot or not (t == c and type(t) is type(c)):
            return None
    if sorted(values) != list(range(len(values))):
        return None
    return [values[k] for k in range(len(values))]


_INT, _FRACTION, _TUPLE, _FROZENSET, _OTHER = range(5)
_KINDS: dict[type, int | tuple[str, ...]] = {}  # a type -> how ``_erase`` writes it (a dataclass: its fields)


def _kind(t: type) -> int | tuple[str, ...]:
    """How ``_erase`` writes a value of type ``t``, worked out once per type (``_integer``'s and
    ``_fields``' questions, asked of every node, were most of ``flat``'s time)."""
    if t is bool:
        return _OTHER
    if t is Slot or issubclass(t, int):
        return _INT
    if issubclass(t, Fraction):
        return _FRACTION
    if issubclass(t, tuple):
        return _TUPLE
    if dataclasses.is_dataclass(t):
        block = t.__name__ == "Block"
        return tuple(f.name for f in dataclasses.fields(t) if not (block and f.name in _IGNORED))
    if issubclass(t, frozenset):
        return _FROZENSET
    return _OTHER


def _erase(x, out: list[str], ints: list) -> None:
    t = type(x)
    kind = _KINDS.get(t)
    if kind is None:
        kind = _KINDS[t] = _kind(t)
    if kind == _INT or (kind == _FRACTION and x.denominator == 1):
        out.append("#")
        ints.append(x)
    elif kind == _TUPLE:
        out.append("(")
        for y in x:
            _erase(y, out, ints)
            out.append(",")
        out.append(")")
    elif type(kind) is tuple:
        out.append(t.__name__ + "(")
        for name in kind:
            _erase(getattr(x, name), out, ints)
            out.append(";")
        out.append(")")
    elif kind == _FROZENSET:
        out.append(repr(sorted(map(repr, x))))
    else:
        out.append(repr(x))


# (node type, field): strings that are never names, though they may be spelled like one: an
# operation, an aggregation, a tag, a memory, an attribute, a special's parameters
LITERAL = frozenset({("Intrinsic", "name"), ("Special", "name"), ("Special", "str_params"),
                     ("Refinement", "agg_op"), ("Refinement", "tags"), ("Location", "name"),
                     ("Block", "tags"), ("Block", "attrs")})
_DECLARES = frozenset({("Index", "name"), ("Refinement", "into"), ("Refinement", "from_")})
_PLAIN, _LIT, _DECL = range(3)
_ROLES: dict[type, tuple[tuple[str, int], ...]] = {}  # a dataclass -> its fields' roles (``canonical``)


def canonical(x, buffers, canon: dict | None = None) -> str:
    """``erased(x)`` with its names canonical: the buffers ``buffers`` (a kernel's table) written
    ``%0, %1, ..`` in table order, the other refinement and index names as they are declared and
    scalars as they appear; a string that names nothing declared before it, or stands where no
    name does (``LITERAL``), as it is. Equal for two kernels equal up to integers and names whose
    buffers sit at the same table positions, and then ``flat`` gives their integers in the same
    order: a template made from one binds the other (``generic``'s forms across programs).
    ``canon``, if given, receives each name's canonical one."""
    canon = {} if canon is None else canon
    canon.update((b, f"%{k}") for k, b in enumerate(buffers))
    out: list[str] = []
    _canon(x, out, canon, _PLAIN)
    return "".join(out)


def _canon(x, out: list[str], canon: dict, role: int) -> None:
    t = type(x)
    if t is str:
        if role == _LIT:
            out.append(repr(x))
        elif role == _DECL or x.startswith("$"):
            out.append(canon.setdefault(x, f"%{len(canon)}"))
        else:
            out.append(canon.get(x) or repr(x))
        return
    kind = _KINDS.get(t)
    if kind is None:
        kind = _KINDS[t] = _kind(t)
    if kind == _INT or (kind == _FRACTION and x.denominator == 1):
        out.append("#")
    elif kind == _TUPLE:
        out.append("(")
        for y in x:
            _canon(y, out, canon, role)
            out.append(",")
        out.append(")")
    elif type(kind) is tuple:
        roles = _ROLES.get(t)
        if roles is None:
            n = t.__name__
            roles = _ROLES[t] = tuple(
                (f, _LIT if (n, f) in LITERAL else _DECL if (n, f) in _DECLARES else _PLAIN) for f in kind)
        out.append(t.__name__ + "(")
        for name, r in roles:
            _canon(getattr(x, name), out, canon, r)
            out.append(";")
        out.append(")")
    elif kind == _FROZENSET:
        out.append(repr(sorted(map(repr, x))))
    else:
        out.append(repr(x))


def slots(x) -> int:
    """How many slots the template ``x`` has."""
    return _max_slot(x) + 1


def _max_slot(x) -> int:
    if type(x) is Slot:
        return x.k
    if isinstance(x, tuple):
        return max((_max_slot(y) for y in x), default=-1)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return max((_max_slot(getattr(x, f.name)) for f in dataclasses.fields(x)), default=-1)
    return -1


def merged(template, kernels: list):
    """``template`` with its slots that hold the same integer in every one of ``kernels`` (instances
    of it) made one slot, numbered from 0 in order of first appearance, the same ``Slot`` object
    wherever it stands: a square kernel's ``N`` in its sizes, strides and a special's parameters,
    which the C-like code generator then compares as equal (tuples compare an object equal to
    itself without asking it) where ``unify`` left one slot per place, each refusing a comparison.
    An instance binds a merged template only where it agrees at every place of a slot (``bind``,
    ``matches``); a kernel where those integers part widens from the unmerged template."""
    rows = [bind(template, k) for k in kernels]
    assert all(r is not None for r in rows), "merged: the kernels are instances of the template"
    n = slots(template)
    new: dict[tuple, Slot] = {}
    by_slot = {k: new.setdefault(tuple(r[k] for r in rows), Slot(len(new))) for k in range(n)}
    out = _renamed(template, by_slot)
    firsts: dict[int, Slot] = {}
    _first_slots(out, firsts)
    for k, s in enumerate(firsts.values()):
        s.k = k
    return out


def _renamed(x, by_slot: dict):
    if type(x) is Slot:
        return by_slot[x.k]
    if isinstance(x, tuple):
        return tuple(_renamed(y, by_slot) for y in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        new = {}
        for name in _fields(x):
            y = getattr(x, name)
            z = _renamed(y, by_slot)
            if z is not y:
                new[name] = z
        return _rebuilt(x, new) if new else x
    return x


def _first_slots(x, out: dict) -> None:
    """The distinct slots of ``x`` (by identity), in order of first appearance."""
    if type(x) is Slot:
        out.setdefault(id(x), x)
    elif isinstance(x, tuple):
        for y in x:
            _first_slots(y, out)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for name in _fields(x):
            _first_slots(getattr(x, name), out)


def is_slot(x) -> bool:
    return type(x) is Slot
