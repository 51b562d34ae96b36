"""What the pass tests share: Before/Expected checks in Stripe text, meaning checks through the
Stripe interpreter, and Hypothesis-drawn lowered programs.

* ``check_rewrite(pass_name, params, before, expected, target)`` parses ``before``, runs the pass
  with ``params`` (checked like a config file's) and the target's hardware, verifies the result
  and compares it structurally with ``expected`` parsed (``==`` on the IR, the texts shown on a
  mismatch). With ``expected=None`` it returns the result for the test to inspect.
* ``assert_same_meaning(before, after)`` runs both programs through the exact Stripe interpreter
  on seeded integer-valued inputs and requires identical outputs.
* ``lowered(src, shapes)`` is a Tile program bound to input shapes and lowered to Stripe.
* ``programs()`` draws lowered programs (with inputs) from the conformance families.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import strategies as st

import tile
from ref_interp.run import input_types
from ref_interp.stripe_exec import run_stripe
from stripe.config import TARGETS, ConfigError, parse_config, pass_params, target_config
from stripe.hardware import Hardware
from stripe.ir import Block, walk
from stripe.lower import lower
from stripe.parser import parse_stripe
from stripe.passes import PASSES
from stripe.printer import format_block
from stripe.verify import verify
from tile.bind import bind


def hardware(target: str = "llvm_cpu") -> Hardware:
    return target_config(target).hardware


def run_pass(pass_name: str, params: dict, program: Block, target: str = "llvm_cpu") -> Block:
    info = PASSES[pass_name]
    out = info.fn(program, pass_params(pass_name, params), hardware(target))
    verify(out)
    return out


def check_rewrite(
    pass_name: str, params: dict, before: str, expected: str | None, target: str = "llvm_cpu"
) -> Block:
    program = parse_stripe(before)
    verify(program)
    out = run_pass(pass_name, params, program, target)
    if expected is not None:
        want = parse_stripe(expected)
        assert out == want, (
            f"pass {pass_name} gave\n{format_block(out)}\nbut the test expects\n{format_block(want)}"
        )
    return out


def inputs_for(program: Block, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded small integers (exact in every dtype) for each input of a program."""
    rng = np.random.default_rng(seed)
    out = {}
    for r in program.refs:
        if "input" in r.tags:
            dt = r.shape.dtype.numpy
            lo = 0 if np.dtype(dt).kind in "ub" else -3
            out[r.into] = rng.integers(lo, 4, r.shape.sizes).astype(dt)
    return out


def assert_same_meaning(before: Block, after: Block, inputs: dict | None = None, seed: int = 0) -> None:
    inputs = inputs if inputs is not None else inputs_for(before, seed)
    want = run_stripe(before, inputs)
    got = run_stripe(after, inputs)
    assert set(want) == set(got), f"outputs {sorted(got)} differ from {sorted(want)}"
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name}")


def lowered(src: str, shapes: dict[str, tuple[int, ...]], dtype=np.float32) -> Block:
    p = tile.parse(src)
    ins = {k: np.zeros(v, dtype) for k, v in shapes.items()}
    return lower(bind(p, input_types(p, ins)))


@st.composite
def programs(draw, families=("contractions", "mixed", "elementwise")):
    """``(program, inputs)``: a conformance case lowered to Stripe, with its integer inputs."""
    from hypothesis import assume

    from conformance import strategies

    family = draw(st.sampled_from(families))
    # the drawn programs of each family, not its sweeps (conformance.sweeps: every operation at once,
    # up to 37 x 43, there to make the suite sharp; through the Stripe interpreter after every pass
    # they made these tests minutes long)
    drawn = {
        "contractions": strategies.drawn_contractions,
        "elementwise": lambda: st.one_of(strategies.chain(), strategies.structural()),
    }
    try:  # the conformance families also draw programs the language refuses (an empty index box)
        case = draw(drawn.get(family, getattr(strategies, family))())
        p = tile.parse(case.source)
        program = lower(bind(p, input_types(p, case.inputs)))
    except tile.TileError:
        assume(False)
    return program, case.inputs


def kernels(program: Block, *tags: str) -> list[Block]:
    """Every kernel block of ``program`` (with ``tags`` too), outermost first."""
    return [k for k in walk(program) if k.has_tags("kernel", *tags)]



def assert_located_config_error(pass_name: str, key: str, value, message: str) -> None:
    """A config whose one step runs ``pass_name`` with ``key: value`` (``reqs``: contractions) is
    refused with ``message``, located at the line of ``key``."""
    step = {"name": "step", "pass": pass_name, "params": {"reqs": ["contraction"], key: value}}
    data = json.loads((TARGETS / "llvm_cpu.json").read_text())
    text = json.dumps({**data, "passes": [step]}, indent=2)
    with pytest.raises(ConfigError) as e:
        parse_config(text, "bad.json")
    assert message in str(e.value)
    line = next(n for n, s in enumerate(text.splitlines(), 1) if f'"{key}"' in s)
    assert f"bad.json:{line}:" in str(e.value)
