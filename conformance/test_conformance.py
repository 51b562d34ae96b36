"""Every program family, compiled for the target, against the reference interpreter.

A failing example is written to ``conformance/failures/`` (see ``report.py``) and the assertion
message ends with its folder and the command that reruns it.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import settings as hypothesis_settings

import ref_interp
import tile
from conformance import capabilities, coverage, precision, report, sweeps, targets
from conformance.coverage import dtypes_used
from conformance.optimized import check_passes
from conformance.strategies import (
    Case,
    contractions,
    defracted,
    elementwise,
    flat,
    gradients,
    mixed,
    optimized,
    products,
    sized,
)
from tile.ast import format_program
from tile.dtypes import DType
from tile.errors import TileLimitError
from tile.inputs import input_types

# drawn programs repeat sums along free output indexes on purpose: the typo warning is noise here
pytestmark = pytest.mark.filterwarnings("ignore::tile.errors.TileIndexWarning")


def check(case: Case, device, passes: bool = False) -> None:
    """``case`` on ``device`` (a ``conformance.targets.Subject``, or a device) against the
    interpreter; with ``passes``, first every config's passes through the Stripe interpreter
    (``conformance.optimized``; under ``--config`` the user's config), and the target runs its
    tiled pipeline (``Device.tiled_optimizer``) besides its default one. An example of another
    shard (``--conformance-shard``) passes unchecked. A difference the device declares
    (``known_difference``) is counted as expected, not failed; an example outside what the subject
        declares (``conformance.capabilities``) is counted as declared unsupported and not run, unless
    it is a sweep whose other outputs the subject runs (``within``): it runs those. Under
    ``--conformance-ops`` an example is first steered to a chosen operation, or left out
    (``coverage.focus``)."""
    subject = targets.as_subject(device)
    key = report.STATS.current or (case.family, subject.name)  # counted under the running test
    digest = targets.example_digest(case.source, case.inputs)
    try:
        prog = tile.parse(case.source)
        bound = tile.bind(prog, input_types(prog, case.inputs), case.inputs)
        if targets.FOCUS:
            focused = coverage.focus(prog, bound, targets.FOCUS)
            if focused is None:
                report.STATS.unfocused(key, digest)
                assume(False)  # Hypothesis draws another, as for an invalid one
            if focused is not prog:
                case, digest, prog, bound = rebuilt(case, focused)
        narrowed, left_out = within(subject, prog, bound), None
        if narrowed is not None:
            narrowed, left_out = narrowed
            case, digest, prog, bound = rebuilt(case, narrowed)
    except tile.TileError:
        report.STATS.invalid(key, digest)
        assume(False)  # not a valid program for these inputs: no target sees it
        return
    # Every shard decides alike whether an example is valid (Hypothesis's next draw depends on it);
    # only the example's own shard runs the target on it. The counts skip replays of an example.
    mine = targets.SHARD.takes(digest)
    for dt in sorted(dtypes_used(bound), key=str):
        if not subject.supports(dt):
            report.STATS.unsupported_example(key, f"{dt} unsupported", digest)
            assume(False)
    declared = subject.declared
    why = capabilities.outside(declared, prog, bound)
    if why is not None:
        report.STATS.declared_unsupported(key, why, digest)
        assume(False)
    mode = subject.settings.get("precision", "native")  # --precision: the interpreter's too
    try:
        want = ref_interp.run(bound, case.inputs, mode)
    except tile.TileError as e:
        report.STATS.invalid(key, digest)
        if mine and subject.device is not None:
            refuses_alike(case, subject, prog, e)
        assume(False)  # refused alike (an empty index space, a double `=` write, ...)
        return
    if not mine:
        report.STATS.other_shard(key, digest)
        return
    # the coarsest float type anywhere in the program (or the mode's products) bounds how far
    # rounding can differ; a matrix product's bound is derived in conformance.precision
    if case.family == "products":
        dtype = DType(case.notes["dtype"])
        size = precision.magnitude(case.source, case.inputs)
        tol = precision.product_tolerance(mode, dtype, case.length, size)
    else:
        floats = [t.dtype for t in bound.types.values() if t.dtype.is_float]
        tol = report.Tolerance(case.exact, case.ulps, case.length, precision.program_eps(mode, floats))
    tol = capabilities.tolerance(declared, tol)
    if report.STATS.example(key, digest) and subject.device is not None:
        report.STATS.coverage.record(subject.name, prog, bound, case.inputs, want, mode, digest)
        if left_out:
            report.STATS.narrowed[(key[1], left_out)] += 1
    if passes:

        user = subject.config.source if subject.config is not None else None

        def pass_failure(target: str, problem: str, want_: dict, got_) -> None:
            fail(case, target, problem, want_, got_, tol, config=user)

        check_passes(bound, case.inputs, tol, pass_failure, subject.pass_configs())
    for settings in subject.compile_settings(passes):
        got = None
        try:
            got = tile.compile(prog, subject.device.id, settings or None)(case.inputs)
        except Exception as e:  # a target that crashes on a valid program fails like a wrong answer
            problem = f"{subject.device.id} raised {type(e).__name__}: {e}"
            if capabilities.is_refusal(e):
                problem += "\n" + capabilities.refusal(subject.device.id, declared)
        else:
            problem = report.compare(want, got, tol)
        if problem is not None:
            config = settings.get("config")
            where = f" (with config {config})" if config else ""
            reason = subject.known_difference(case.source, problem)
            if reason is not None:
                report.STATS.expected(key, reason)
                continue
            fail(case, subject.device.id, problem + where, want, got, tol, config=config)


def rebuilt(case: Case, program) -> tuple[Case, str, object, object]:
    """``case`` with ``program`` (a changed ``tile.ast.Program``) as its source and only the inputs
    it takes: the case, its digest, the program parsed and bound again."""
    names = {i.name for i in program.inputs}
    inputs = {k: v for k, v in case.inputs.items() if k in names}
    case = dataclasses.replace(case, source=format_program(program), inputs=inputs)
    prog = tile.parse(case.source)
    bound = tile.bind(prog, input_types(prog, case.inputs), case.inputs)
    return case, targets.example_digest(case.source, case.inputs), prog, bound


def within(subject, prog, bound):
    """The program narrowed to what ``subject`` runs (``sweeps.within``: a sweep's outputs in the
    types and operations it has and declares) and what was left out (for the summary's "narrowed"
    line), or None where it runs all of it or it cannot be narrowed (then the example is counted
    unsupported or declared unsupported, as drawn)."""
    declared = subject.declared

    def runs_dtype(dt: DType) -> bool:
        return subject.supports(dt) and (declared is None or declared.allows_dtype(dt))

    def runs_operation(op: str) -> bool:
        return declared is None or declared.allows_operation(op)

    dtypes = dtypes_used(bound)
    if all(runs_dtype(dt) for dt in dtypes) and capabilities.outside(declared, prog, bound) is None:
        return None
    narrowed = sweeps.within(prog, bound, runs_dtype, runs_operation)
    if narrowed is None:
        return None
    ops = {s.op for s in coverage.sites(prog, bound.constants) if not runs_operation(s.op)}
    left_out = sorted(str(dt) for dt in dtypes if not runs_dtype(dt)) + sorted(ops)
    return narrowed, ", ".join(left_out) or "what it does not run"


def fail(
    case: Case,
    target: str,
    problem: str,
    want: dict,
    got,
    tol,
    refusal: str | None = None,
    config: str | None = None,
) -> None:
    """Write the failing example and raise, ending with the command that reproduces it."""
    folder = report.write_failure(case, target, want, got, problem, tol, refusal, config)
    raise AssertionError(
        f"{problem}\nprogram:\n{case.source}\n"
        f"written to {folder}/ (case.tile, inputs.npz, expected.npz); reproduce with:\n"
        f"    {report.reproduce_command(folder, target, config)}"
    )


def refuses_alike(case: Case, subject, prog, error: tile.TileError) -> None:
    """A program the interpreter refuses for its inputs must be refused by the target with the same
    located error, not answered."""
    if isinstance(error, TileLimitError):
        return  # the interpreter's own resource bound, not a language rule
    device = subject.device
    refusal = report.refusal_text(error)
    head = f"the interpreter refuses it with {refusal}\nbut {device.id}"
    got = None
    try:
        got = tile.compile(prog, device.id, subject.settings or None)(case.inputs)
    except tile.TileError as e:
        if report.refusal_text(e) == refusal:
            return
        problem = f"{head} raised {type(e).__name__}: {e.message}"
    except Exception as e:
        problem = f"{head} raised {type(e).__name__}: {e}"
    else:
        problem = f"{head} answered"
    reason = subject.known_difference(case.source, problem)
    if reason is not None:
        report.STATS.expected(report.STATS.current or (case.family, subject.name), reason)
        return
    config = subject.settings.get("config")
    fail(case, device.id, problem, {}, got, report.Tolerance(), refusal, config)


def needs(device, dtype: DType, why: str) -> None:
    """Skip a family whose every program uses ``dtype`` when the target lacks it."""
    subject = targets.as_subject(device)
    if not subject.supports(dtype) or (dtype == DType.FLOAT64 and not subject.has_fp64()):
        pytest.skip(f"{subject.name} has no {dtype}: {why}")


def compiled(device) -> None:
    """Skip a family that only compares compiled results when the subject is a config alone."""
    subject = targets.as_subject(device)
    if subject.device is None:
        pytest.skip(f"{subject.name} names no device: only its passes are checked (test_optimized)")


@given(contractions())
def test_contractions(device, case):
    compiled(device)
    check(case, device)


@given(elementwise())
def test_elementwise(device, case):
    compiled(device)
    check(case, device)


@given(mixed())
def test_mixed(device, case):
    compiled(device)
    check(case, device)


@given(gradients())
def test_gradients(device, case):
    compiled(device)
    needs(device, DType.FLOAT64, "gradient programs are checked in float64")
    check(case, device)


@given(defracted())
def test_defracted(device, case):
    compiled(device)
    check(case, device)


@given(flat())
def test_flat(device, case):
    compiled(device)
    check(case, device)


@given(optimized())
def test_optimized(device, case):
    check(case, device, passes=True)


@given(sized())
def test_sized(device, case):
    compiled(device)
    check(case, device)


@hypothesis_settings(max_examples=max(6, hypothesis_settings.default.max_examples // 4))  # a quarter
@given(products())
def test_products(device, case):
    """Matrix products of random normal data in the run's precision mode (``--precision``)."""
    compiled(device)
    check(case, device)
