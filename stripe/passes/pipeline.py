"""Running a target's pass list over a lowered program.

``optimize(program, config)`` applies each ``PassSpec`` of the config in order and returns the
optimized ``#program``. ``steps(...)`` yields ``(spec, program, seconds)`` after each pass, for
tests and ``--after``. Options:

* ``after=NAME`` stops after the step named ``NAME`` (or the first step running pass ``NAME``);
  an unknown name is a ``ConfigError`` listing the steps.
* ``strict=True`` skips the passes registered as reordering aggregation (``PassInfo.reorders``),
  so every element still receives its values in the interpreter's order.
* ``check=True`` runs ``stripe.verify`` after every pass (the tests do).
* ``TILE_DEBUG=2`` prints each step's name, pass, time and the program after it, to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

from stripe.config_types import ConfigError, PassSpec, TargetConfig
from stripe.ir import Block
from stripe.passes.registry import PASSES
from stripe.printer import format_block
from stripe.verify import verify


def steps(
    program: Block, config: TargetConfig, *, strict: bool = False, check: bool = False
) -> Iterator[tuple[PassSpec, Block, float]]:
    debug = os.environ.get("TILE_DEBUG", "0") >= "2"
    for spec in config.passes:
        info = PASSES[spec.pass_]
        if strict and info.reorders:
            if debug:
                print(f"=== {spec.name} ({spec.pass_}): skipped (strict order)", file=sys.stderr)
            continue
        start = time.perf_counter()
        program = info.fn(program, spec.params, config.hardware)
        seconds = time.perf_counter() - start
        if check:
            verify(program)
        if debug:
            print(f"=== {spec.name} ({spec.pass_}): {seconds * 1e3:.1f} ms", file=sys.stderr)
            print(format_block(program), file=sys.stderr)
        yield spec, program, seconds


def optimize(
    program: Block,
    config: TargetConfig,
    *,
    after: str | None = None,
    strict: bool = False,
    check: bool = False,
) -> Block:
    if after is not None and not any(after in (s.name, s.pass_) for s in config.passes):
        names = ", ".join(s.name for s in config.passes) or "none"
        raise ConfigError(
            f"config '{config.name}' has no pass step named '{after}'",
            None,
            f"--after takes a step's name or pass: {names}",
        )
    result = program
    for spec, result, _ in steps(program, config, strict=strict, check=check):  # noqa: B007
        if after is not None and after in (spec.name, spec.pass_):
            break
    return result
