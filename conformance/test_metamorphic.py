"""The ``metamorphic`` family: drawn programs (contractions, elementwise chains, mixed programs),
rewritten by one to three semantics-preserving rewrites of ``conformance.metamorphic`` (dead
branches behind opaque predicates, integer reassociation, transposed input layouts, split and
inlined temporaries, renamed indices, identity constraints). Each variant must agree with the
interpreter on the target (``test_conformance.check``, with its failure folder), and with its
original program on the target. A quarter of the profile's examples: each compiles two programs."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import tile
from conformance import metamorphic as mm
from conformance import precision, report, targets
from conformance.strategies import Case, contractions, elementwise, mixed
from conformance.test_conformance import check, compiled, fail
from tile.inputs import input_types

pytestmark = pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning")


@st.composite
def variants(draw) -> tuple[Case, Case]:
    """(the original program, its rewritten variant as the family's ``Case``)."""
    base = draw(st.one_of(contractions(), elementwise(), mixed()))
    names = draw(st.lists(st.sampled_from(list(mm.REWRITES)), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**16))
    try:
        out, done = mm.apply(mm.Variant(tile.parse(base.source), base.inputs), names, seed)
    except tile.TileError:
        assume(False)  # the drawn program does not bind for its inputs: no variant to draw
    assume(done)
    notes = {"rewrites": done, "original": base.source}
    return base, Case("metamorphic", out.source, out.inputs, base.exact, base.ulps, base.length, notes)


def agree_with_original(base: Case, case: Case, device) -> None:
    """The variant's outputs and the original's, both from the target, within the family's
    tolerance (both are within it of the interpreter's one result, so twice it bounds them)."""
    subject = targets.as_subject(device)
    if not targets.SHARD.takes(targets.example_digest(case.source, case.inputs)):
        return
    try:
        prog = tile.parse(base.source)
        bound = tile.bind(prog, input_types(prog, base.inputs), base.inputs)
    except tile.TileError:
        return
    mode = subject.settings.get("precision", "native")
    floats = [t.dtype for t in bound.types.values() if t.dtype.is_float]
    tol = report.Tolerance(case.exact, 2 * case.ulps, case.length, precision.program_eps(mode, floats))
    settings = subject.settings or None
    try:
        want = tile.compile(prog, subject.device.id, settings)(base.inputs)
        got = tile.compile(case.source, subject.device.id, settings)(case.inputs)
    except tile.TileError:
        return  # refused alike or not: check() compared the variant with the interpreter
    problem = report.compare(want, got, tol)
    if problem is not None:
        rewrites = ", ".join(case.notes["rewrites"])
        problem = f"the variant ({rewrites}) and the original differ on {subject.device.id}: {problem}"
        fail(case, subject.device.id, f"{problem}\noriginal:\n{base.source}", want, got, tol)


@hypothesis_settings(max_examples=max(6, hypothesis_settings.default.max_examples // 4))
@given(variants())
def test_metamorphic(device, pair):
    compiled(device)
    base, case = pair
    check(case, device)
    agree_with_original(base, case, device)
