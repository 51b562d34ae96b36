"""The attention family (issue 41): drawn softmax attention programs (``conformance.attention``) on
each target against the interpreter, within docs/semantics.md §8.7's tolerance (a target whose
pipeline fuses the chain, ``stripe.passes.attention``, runs an online softmax in float32: not the
interpreter's rounding, but within the bound); and their gradients as ``tile.autodiff`` derives
them (fused by ``stripe.passes.attention_backward`` where the pipeline has it), within the
gradients' bound."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hypothesis_settings

import ref_interp
from backends.driver import compile_bound
from conformance import attention, report, targets
from conformance.test_conformance import compiled
from tile import parse
from tile.bind import bind
from tile.dtypes import DType
from tile.inputs import input_types


@hypothesis_settings(max_examples=max(4, hypothesis_settings.default.max_examples // 4), deadline=None)
@given(attention.cases())
def test_attention(device, case):
    spec, src, ins = case
    got = _both(device, spec, src, ins)
    if got is not None:
        attention.assert_close(spec, ins, got[0]["O"], got[1]["O"])


@hypothesis_settings(max_examples=max(3, hypothesis_settings.default.max_examples // 8), deadline=None)
@given(attention.cases(most=16))
def test_attention_gradient(device, case):
    spec = case[0]
    src, ins = attention.gradient_source(spec), attention.gradient_inputs(spec, len(case[1]))
    got = _both(device, spec, src, ins)
    if got is not None:
        attention.assert_gradients_close(spec, ins, *got)


def _both(device, spec, src: str, ins: dict):
    """(the target's results, the interpreter's) of one example, counted in the report; None
    (counted as unsupported) where the target lacks the example's dtype."""
    compiled(device)
    subject = targets.as_subject(device)
    key = report.STATS.current or ("attention", subject.name)
    digest = targets.example_digest(src, ins)
    if not subject.supports(DType(spec.dtype)):
        report.STATS.unsupported_example(key, f"no {spec.dtype}", digest)
        return None
    report.STATS.example(key, digest)
    prog = parse(src)
    bound = bind(prog, input_types(prog, ins))
    return compile_bound(bound, subject.device, subject.settings)(ins), ref_interp.run(bound, ins)
