"""Long programs compile in time that grows gently with their length (issue 16).

The time itself is measured, not asserted (bench/cases.py's ``chain_5000_statements`` records it);
these tests pin down the structure that keeps it near-linear: a 5,000-statement elementwise chain
becomes a few dozen kernels on ``llvm_cpu`` (one kernel per statement would take LLVM seconds), each
fused group stays within the config's refinement cap (which bounds fusion's work per statement), and
the answer is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends import registry
from backends.driver import compile_bound, config_for
from bench.cases import long_chain, long_chain_ref
from stripe.lower import lower
from stripe.passes.pipeline import optimize
from tile.bind import bind
from tile.inputs import input_types
from tile.parser import parse

pytestmark = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason=f"llvm_cpu.0 unavailable: {registry.unavailable()}"
)


def _bound(n: int, a: np.ndarray):
    prog = parse(long_chain(n))
    return bind(prog, input_types(prog, {"A": a}))


def test_chain_of_5000_statements_compiles_to_few_kernels_and_is_exact():
    a = np.arange(-8, 9, dtype=np.float32)
    compiled = compile_bound(_bound(5000, a), registry.get("llvm_cpu.0"), {"cache": False})
    # 5,000 statements in groups of at most 11, fused again once their temporaries are registers:
    # about 5000 / 11 / 11 kernels. Hundreds would mean the second round stopped working.
    assert len(compiled.infos) <= 60, len(compiled.infos)
    np.testing.assert_array_equal(compiled({"A": a})["O"], long_chain_ref(a, 5000))


def test_fused_groups_stay_within_the_refinement_cap():
    """After the first fusion step every kernel has at most ``max_refs`` refinements: the work of
    checking one more statement against a group is bounded, so fusing n statements is O(n)."""
    a = np.zeros(4, np.float32)
    config = config_for(registry.get("llvm_cpu.0"), {})
    (step,) = [s for s in config.passes if s.name == "fuse_eltwise"]
    program = optimize(lower(_bound(600, a)), config, after="fuse_eltwise")
    kernels = program.stmts[0].stmts
    assert all(len(k.refs) <= step.params.max_refs for k in kernels)
    assert len(kernels) <= 600 // (step.params.max_refs - 2)  # groups are full, not pairs


def test_chain_meaning_is_kept_at_every_step():
    """A shorter chain through the whole pipeline (every step verified) equals numpy exactly."""
    a = np.arange(-3, 4, dtype=np.float32)
    bound = _bound(300, a)
    program = optimize(lower(bound), config_for(registry.get("llvm_cpu.0"), {}), check=True)
    assert len(program.stmts[0].stmts) <= 5
    out = compile_bound(bound, registry.get("llvm_cpu.0"), {"cache": False})({"A": a})
    np.testing.assert_array_equal(out["O"], long_chain_ref(a, 300))



def test_inherited_folds_equal_fresh_ones():
    """Each fused group inherits the folds over its statements from the group it grew from
    (``fusion_checks.inherit``): computed from those seeds, its analyses equal fresh ones (outside
    ``remembering()`` nothing is remembered), and the pass fuses the same groups either way."""
    from stripe.passes import fusion_checks as fc
    from stripe.passes.fusion import FusionConfig, _fuse_statements

    main = lower(_bound(60, np.zeros(4, np.float32))).stmts[0]
    cfg = FusionConfig(a_reqs=("eltwise",), b_reqs=("eltwise",), b_fully_fused=True, max_refs=12)
    analyses = (fc._kids_ok, fc._spreads, fc._reads_writes, fc._nested_ok, fc._all_fixed, fc.by_source)
    with fc.remembering():
        fused = _fuse_statements(main, cfg)
        groups = [k for k in fused.stmts if len(k.stmts) > 1]
        assert len(groups) >= 5 and all(fc._prefix(k, "_spreads")[0] > 1 for k in groups)
        seeded = [[f(k) for f in analyses] for k in groups]
    assert seeded == [[f(k) for f in analyses] for k in groups]
    assert _fuse_statements(main, cfg) == fused
