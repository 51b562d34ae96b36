"""Contraction transforms: reduce, defract and flatten (see each module), and whole-program stages.

Stages, in pipeline order: ``tile`` (as written), ``reduced`` (single-variable output indices),
``defracted`` (integer coefficients), ``flat`` (the backend form). Every stage has the same meaning:
the interpreter gives identical results on each.
"""

from __future__ import annotations

import dataclasses

from tile.transforms.defract import defract
from tile.transforms.flat import FlatContraction, as_contraction, flatten, format_flat
from tile.transforms.reduce import reduce
from tile.typed import BoundProgram, TContraction

STAGES = ("tile", "reduced", "defracted", "flat")


def transform(c: TContraction, stage: str) -> TContraction | FlatContraction:
    """One contraction taken to ``stage``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, not {stage!r}")
    if stage == "tile":
        return c
    c = reduce(c)
    if stage == "reduced":
        return c
    c = defract(c)
    return c if stage == "defracted" else flatten(c)


def apply_stage(bound: BoundProgram, stage: str) -> BoundProgram:
    """``bound`` with every contraction taken to ``stage`` (flat contractions become
    ``FlatContraction`` statements)."""
    stmts = tuple(transform(s, stage) if isinstance(s, TContraction) else s for s in bound.stmts)
    return dataclasses.replace(bound, stmts=stmts)


__all__ = [
    "STAGES",
    "FlatContraction",
    "apply_stage",
    "as_contraction",
    "defract",
    "flatten",
    "format_flat",
    "reduce",
    "transform",
]
