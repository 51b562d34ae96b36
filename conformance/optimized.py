"""The ``optimized`` family: every target config's passes keep a program's meaning.

For a drawn program (contractions, elementwise chains, mixed programs), the exact Stripe
interpreter runs the lowered program once, then the program after **each pass** of every
built-in config (``stripe/targets/*.json``) and of a *small* variant of each (every memory shrunk
to ``conformance.targets.SMALL_BYTES`` and every unit to a few threads, so that the tiny
conformance shapes get tiled, cached and scheduled for real), with ``stripe.verify`` after every
pass (each distinct program once: ``check_passes``). Each result must equal the lowered
program's: exactly on integer-valued data, within the reduction-length tolerance where float
rounding may differ (passes may reorder aggregation, semantics §8.1). The accelerator config has
no hardware; this is where its optimized programs are checked. The compiled target
then runs the program optimized by its own config (``test_conformance.check``). A config's passes
give the same result whatever the target, so a run over several targets checks every built-in
config under its first one, and under each other target only that device's own configs
(``conformance.targets.Subject.pass_configs``).

A failure is recorded against the target ``stripe:<config>@<step>``, which
``python -m conformance.reproduce`` understands.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from conformance.targets import small
from stripe.config import TargetConfig, builtin_names, target_config


@lru_cache(maxsize=1)
def configs() -> tuple[TargetConfig, ...]:
    """Every built-in config and its small variant, once per distinct (hardware, passes): a config
    that only renames another (``opencl_gpu`` extends ``cuda`` and changes no setting) would
    repeat its work."""
    out, seen = [], []
    for cfg in _builtins():
        if (cfg.hardware, cfg.passes) not in seen:
            seen.append((cfg.hardware, cfg.passes))
            out += [cfg, small(cfg)]
    return tuple(out)


def _builtins() -> list[TargetConfig]:
    return [target_config(name) for name in builtin_names()]


def config_named(name: str, path: str | None = None) -> TargetConfig:
    """A built-in config or its small variant by name; with ``path``, the user's config in that
    file (``name`` may end in ``-small``)."""
    known = [c for cfg in _builtins() for c in (cfg, small(cfg))]
    if path is not None:
        from stripe.config import load_config

        user = load_config(path)
        known = (user, small(user))
    for cfg in known:
        if cfg.name == name:
            return cfg
    raise KeyError(f"no config '{name}' (known: {', '.join(c.name for c in known)})")


def after_step(bound, config: TargetConfig, step: str | None):
    """The lowered program, optimized by ``config`` up to and including ``step`` (None: all)."""
    from stripe.lower import lower
    from stripe.passes import optimize

    return optimize(lower(bound), config, after=step, check=True)


def check_passes(bound, inputs: dict[str, np.ndarray], tol, on_failure, checked=None) -> None:
    """Run every config's passes over ``bound``'s lowered program (``checked``: these configs
    instead of the built-in ones and their small variants); ``on_failure(target, problem, want,
    got)`` is called at the first pass whose result differs (or that fails to verify/run).

    Each distinct program is verified and interpreted once: on the suite's small programs most
    steps change nothing, and configs share their first steps' results (12 drawn examples: 151
    distinct programs among 2,140 steps; ``stripe.verify`` was 90% of the passes' time). A program
    met again was already verified and found equal to the lowered program's result, so skipping it
    changes no verdict and no step a failure is reported at."""
    from conformance.report import compare
    from ref_interp.stripe_exec import run_stripe
    from stripe.lower import lower
    from stripe.passes import steps
    from stripe.verify import verify

    lowered = lower(bound)
    want = run_stripe(lowered, inputs)
    agreed: set = set()  # programs verified and run, whose result equals ``want``
    for cfg in checked if checked is not None else configs():
        it = steps(lowered, cfg)  # verified below, once per distinct program
        previous = None
        for spec in cfg.passes:  # steps() yields once per pass, in this order
            target = f"stripe:{cfg.name}@{spec.name}"
            try:
                _, program, _ = next(it)
                if program is previous or _met(program, agreed):
                    previous = program
                    continue
                verify(program)
            except Exception as e:  # a pass that crashes or breaks verify is a failure too
                on_failure(target, f"pass step {spec.name} raised {type(e).__name__}: {e}", want, None)
                return
            try:
                got = run_stripe(program, inputs)
            except Exception as e:
                on_failure(target, f"the optimized program raised {type(e).__name__}: {e}", want, None)
                return
            problem = compare(want, got, tol)
            if problem is not None:
                on_failure(target, f"after pass step {spec.name} ({spec.pass_}): {problem}", want, got)
                return
            previous = program
            _agree(program, agreed)


def _met(program, agreed: set) -> bool:
    try:
        return program in agreed
    except TypeError:  # a node holding something unhashable: checked every time
        return False


def _agree(program, agreed: set) -> None:
    try:
        agreed.add(program)
    except TypeError:
        pass


class StripeTarget:
    """``stripe:<config>@<step>`` as a target: the program optimized up to that step, run by the
    Stripe interpreter (what ``python -m conformance.reproduce`` runs for such a folder)."""

    def __init__(self, source: str, target: str, config: str | None = None):
        name, _, step = target.removeprefix("stripe:").partition("@")
        self.source = source
        self.config = config_named(name, config)
        self.step = step or None

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tile
        from ref_interp.stripe_exec import run_stripe
        from tile.inputs import input_types

        prog = tile.parse(self.source)
        bound = tile.bind(prog, input_types(prog, inputs), inputs)
        return run_stripe(after_step(bound, self.config, self.step), inputs)
