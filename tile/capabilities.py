"""What a target declares it supports: ``Declared``, one frozen dataclass shared by the three ways a
target can say so (a plugin device's ``Capabilities.declared``, the external protocol's version 2
handshake, a target config's ``"capabilities"`` section), and the vocabulary it is written in.

An operation is named as the conformance suite's coverage counts it: a builtin by its name
(``max``, ``cmp_lt``, ``as_float``, ``gather``; an operator by its builtin: ``+`` is ``add``), an
aggregation as ``agg_sum``/``agg_prod``/``agg_max``/``agg_min``/``agg_assign`` and a combination
as ``comb_mul``/``comb_add``/``comb_eq``/``comb_cond``. Every field left ``None`` declares
nothing: the target claims all of it. The conformance suite draws within the declaration and counts
what falls outside as "declared unsupported"; an example within it that the target refuses fails.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, fields

from tile.ast import AggOp, CombOp
from tile.dtypes import DType

AGGREGATIONS = {
    AggOp.SUM: "agg_sum", AggOp.PROD: "agg_prod", AggOp.MAX: "agg_max", AggOp.MIN: "agg_min",
    AggOp.ASSIGN: "agg_assign",
}  # fmt: skip
COMBINATIONS = {
    CombOp.MUL: "comb_mul", CombOp.ADD: "comb_add", CombOp.EQ: "comb_eq", CombOp.COND: "comb_cond",
}  # fmt: skip


@functools.cache
def operations() -> frozenset[str]:
    """Every operation a target may declare: the builtins, ``agg_*`` and ``comb_*``. Made at first
    use, so that ``backends.hal`` (which imports this module) loads no builtin table, and with it no
    sympy, for ``python -m tile devices``."""
    from tile.builtins import BUILTINS

    return frozenset(BUILTINS) | frozenset(AGGREGATIONS.values()) | frozenset(COMBINATIONS.values())


def __getattr__(name: str):
    if name == "OPERATIONS":  # tile.capabilities.OPERATIONS: operations(), made at first use
        return operations()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


STAGES = ("tile", "stripe", "optimized")  # the forms a program is handed over in (backends.program)
# how closely the target promises to match the interpreter: "exact" its bits on every example,
# "standard" the suite's tolerances (docs/semantics.md §8), "relaxed" RELAXED times them
TOLERANCES = ("exact", "standard", "relaxed")
RELAXED = 16


@dataclass(frozen=True)
class Declared:
    """A target's declaration. Collections are kept as sorted tuples (a set or list is accepted),
    so a declaration compares and hashes by value; ``invalid()`` says what is wrong with one."""

    operations: tuple[str, ...] | None = None  # None: every operation
    dtypes: tuple[str, ...] | None = None  # DType values; None: the device's dtypes
    stages: tuple[str, ...] | None = None  # of STAGES; None: any
    max_rank: int | None = None  # the most dimensions of any tensor
    max_elements: int | None = None  # the most elements of any tensor
    tolerance: str = "standard"

    def __post_init__(self):
        for f in ("operations", "dtypes", "stages"):
            value = getattr(self, f)
            if value is not None and not isinstance(value, str):
                items = (v.value if isinstance(v, DType) else v for v in value)
                object.__setattr__(self, f, tuple(sorted(set(items), key=str)))

    def invalid(self) -> tuple[str, str, str] | None:
        """(field, message, hint) for the first bad value, or None (a config reports it there)."""
        vocabulary = (("operations", operations()), ("dtypes", {d.value for d in DType}), ("stages", STAGES))
        for f, known in vocabulary:
            value = getattr(self, f)
            if isinstance(value, str):
                return f, f"'{f}' is the string {value!r}, not a list", f'write ["{value}"]'
            bad = [v for v in value or () if v not in known]
            if bad:
                close = difflib.get_close_matches(str(bad[0]), sorted(known), 1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                listed = "tile.capabilities.OPERATIONS" if f == "operations" else ", ".join(known)
                return f, f"unknown {f[:-1]} {bad[0]!r}", hint + f"the {f} are: {listed}"
        for f in ("max_rank", "max_elements"):
            value = getattr(self, f)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                return f, f"{f} is {value!r}, not a positive integer", "write a number >= 1, or leave it out"
        if self.tolerance not in TOLERANCES:
            hint = f"one of {', '.join(TOLERANCES)}"
            return "tolerance", f"unknown tolerance class {self.tolerance!r}", hint
        return None

    def allows_operation(self, name: str) -> bool:
        return self.operations is None or name in self.operations

    def allows_dtype(self, dtype: DType) -> bool:
        return self.dtypes is None or dtype.value in self.dtypes

    def allows_stage(self, stage: str) -> bool:
        return self.stages is None or stage in self.stages

    def restrict(self, other: Declared | None) -> Declared:
        """What both declarations allow (a config's declaration on a device's)."""
        if other is None:
            return self

        def both(a, b):
            if a is None or b is None:
                return a if b is None else b
            return tuple(sorted(set(a) & set(b))) if isinstance(a, tuple) else min(a, b)

        values = {f.name: both(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)}
        order = TOLERANCES.index  # the stricter promise wins
        values["tolerance"] = min(self.tolerance, other.tolerance, key=order)
        return Declared(**values)

    def to_json(self) -> dict:
        """The declaration as the handshake and the report sheet write it (only what it declares)."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (f.name != "tolerance" or value != "standard"):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def from_json(data) -> Declared:
        """A declaration from JSON data (the handshake's ``capabilities``); a ``ValueError`` saying
        what is wrong (an unknown key, a bad value)."""
        if not isinstance(data, dict):
            raise ValueError(f"is {type(data).__name__}, not an object")
        known = [f.name for f in fields(Declared)]
        for k in data:
            if k not in known:
                raise ValueError(f"has the unknown key {k!r} (the keys are {', '.join(known)})")
        for k in ("operations", "dtypes", "stages"):
            value = data.get(k)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ValueError(f"'{k}' is {json.dumps(value)[:60]}, not a list of strings")
        declared = Declared(**data)
        bad = declared.invalid()
        if bad is not None:
            raise ValueError(f"{bad[1]} ({bad[2]})")
        return declared
