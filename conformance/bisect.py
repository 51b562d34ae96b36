"""``python -m conformance.bisect DIR [--config F.json | --target ID]``: which pass broke it.

DIR is a folder the conformance suite wrote (``conformance.report``). The program is lowered to
Stripe and run by the Stripe interpreter after the lowering and after **each pass step** of an
optimizer config, and compared with the interpreter's outputs (``expected.npz``) under the
folder's tolerance, as PlaidML's per-pass differential runner did. The first step that differs,
raises or breaks ``stripe.verify`` is the culprit: its Before and After Stripe text are printed as
a unified diff, with the differing elements and their indexes. Where every step agrees, the
device's compiled program is run too; if only it differs, the device's code generator is named.

The config: ``--config`` (a file or a built-in config's name), else the target's: a device's own
(``backends.runner.device_config``, with the sizes the device reports), or for a target
``stripe:<config>@<step>`` that built-in config (``conformance.optimized``). The target is
``--target``, else the one recorded in the folder (with the config its problem names, for a
failure of the device's tiled pipeline). A whole-program device (``backends.program``) shows no
passes: only its outputs are compared.

Exit status 0: nothing differs any more; 1: a culprit was found (a pass step, the lowering or the
code generator); 2: the folder, the config or the target is unusable.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from conformance.report import (
    Failure,
    NotAFailure,
    Tolerance,
    compare,
    differing,
    element_text,
    read_failure,
)

ELEMENTS = 10  # differing elements shown per output


class Unusable(Exception):
    """The folder, config or target cannot be bisected (exit status 2); the message says why.
    ``located``: the message is a ``TileError``'s, which says what it is and where itself."""

    def __init__(self, message: str, located: bool = False):
        super().__init__(message)
        self.located = located


@dataclass
class Plan:
    """What to run: ``config``'s pass steps (None: no passes), then ``target`` compiled (with
    ``{"config": config_arg}`` where one was named) on ``device`` (None: no compiled program, for
    a ``stripe:`` target); a ``whole_program`` device is only compiled and run."""

    target: str
    config: object  # stripe.config.TargetConfig | None
    config_arg: str | None  # what --config named, or the folder recorded
    device: object  # backends.hal.Device | backends.program.ProgramDevice | None
    whole_program: bool = False


def load_failure(folder: Path) -> Failure:
    try:
        failure = read_failure(folder)
    except NotAFailure as e:
        raise Unusable(str(e)) from None
    meta = failure.meta
    if meta.get("refusal") is not None:
        refusal = str(meta["refusal"]).splitlines()[0]
        raise Unusable(
            f"the interpreter refuses the program of {folder} ({refusal}), so there "
            f"are no outputs to bisect against; `python -m conformance.reproduce {folder}` checks that the "
            "target refuses it too"
        )
    return failure


def _recorded_config(meta: dict) -> str | None:
    """The config the target failed with: a user's config file (``config`` in case.json), or a
    built-in pipeline the suite ran besides the device's own (the problem then ends with
    ``(with config NAME)``, ``conformance.test_conformance.check``)."""
    if meta.get("config"):
        return str(meta["config"])
    found = re.search(r"\(with config (\S+)\)\s*$", meta.get("problem", ""))
    return found.group(1) if found else None


def plan(failure: Failure, config_arg: str | None, target_arg: str | None) -> Plan:
    """The config and device to bisect with; ``Unusable`` for a bad config or an unknown target."""
    import tile
    from backends import registry
    from backends.driver import config_for
    from backends.program import ProgramDevice
    from conformance.optimized import config_named, small
    from stripe.config import resolve_config

    target = target_arg or failure.meta["target"]
    if not config_arg and not target_arg:
        config_arg = _recorded_config(failure.meta)
    if target == "interp":
        raise Unusable("'interp' is the reference interpreter itself: give a device id or stripe:CONFIG@STEP")
    try:
        if target.startswith("stripe:"):
            name = target.removeprefix("stripe:").partition("@")[0]
            if not config_arg:
                return Plan(target, config_named(name), None, None)
            config = resolve_config(config_arg)
            if name == f"{config.name}-small":  # the suite checks each config shrunk too
                config = small(config)
            return Plan(target, config, config_arg, None)
        device = registry.get(target)
        if isinstance(device, ProgramDevice):
            if config_arg:
                resolve_config(config_arg)  # a bad file is refused here, not by the device
            return Plan(target, None, config_arg, device, whole_program=True)
        config = config_for(device, {"config": config_arg} if config_arg else {})
        return Plan(target, config, config_arg, device)
    except KeyError as e:
        raise Unusable(e.args[0]) from None
    except tile.TileError as e:
        raise Unusable(str(e), located=True) from None


def differences(want: dict, got: dict, tol: Tolerance, limit: int = ELEMENTS) -> list[str]:
    """Lines naming the elements that differ (up to ``limit`` per output), with their indexes."""
    lines = []
    for name in want:
        w, g = np.asarray(want[name]), np.asarray(got.get(name))
        if name not in got or g.dtype != w.dtype or g.shape != w.shape:
            return [compare(want, got, tol) or ""]
        where = differing(w, g, tol)
        if not where:
            continue
        lines.append(f"{name}: {len(where)} of {w.size} elements differ")
        lines += [f"    {element_text(name, ix, w, g)}" for ix in where[:limit]]
        if len(where) > limit:
            lines.append(f"    ... and {len(where) - limit} more")
    extra = sorted(set(got) - set(want))
    if extra:
        lines.append(f"unexpected outputs: {', '.join(extra)}")
    return lines


def stripe_diff(before, after, name: str, limit: int) -> list[str]:
    """The unified diff of two programs' Stripe text (at most ``limit`` lines; 0: all)."""
    from stripe.printer import format_block

    lines = list(
        difflib.unified_diff(
            format_block(before).splitlines(),
            format_block(after).splitlines(),
            f"before {name}",
            f"after {name}",
            lineterm="",
        )
    )
    if not lines:
        return ["(the Stripe text is the same before and after)"]
    if limit and len(lines) > limit:
        return lines[:limit] + [f"... {len(lines) - limit} more diff lines (--diff-lines 0 shows all)"]
    return lines


def _where(error: BaseException) -> str:
    """The innermost frame an exception came from, ``file:line in function``."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"


def _indent(lines: list[str]) -> None:
    for line in lines:
        print(f"    {line}")


class Bisector:
    """Runs the steps of one plan over one failure, printing a line per step."""

    def __init__(self, failure: Failure, plan_: Plan, diff_lines: int):
        self.f = failure
        self.plan = plan_
        self.diff_lines = diff_lines

    def header(self) -> None:
        f, p = self.f, self.plan
        print(f"folder: {f.folder}")
        print(
            f"family {f.meta['family']}, recorded on {f.meta['target']}: {f.meta['problem'].splitlines()[0]}"
        )
        if p.whole_program:
            dev = p.device
            print(
                f"target {p.target} is a whole-program device ({type(dev).__module__}.{type(dev).__name__}, "
                f"stage {dev.stage}): its passes are not visible, only its outputs are compared"
            )
        elif p.config is None:
            print(f"target {p.target} has no optimizer config: no passes, the lowered program is compiled")
        else:
            run = f"; then compiled for {p.target}" if p.device is not None else ""
            print(f"config: {p.config.name} from {p.config.source}, {len(p.config.passes)} pass steps{run}")

    def run(self) -> int:
        import tile
        from tile.inputs import input_types

        try:
            prog = tile.parse(self.f.source)
            bound = tile.bind(prog, input_types(prog, self.f.inputs), self.f.inputs)
        except tile.TileError as e:
            raise Unusable(f"the folder's program does not bind to its inputs:\n{e}") from None
        self.header()
        if self.plan.whole_program:
            return self.compiled("whole-program device")
        lowered = self.lowering(bound)
        if lowered is None:
            return 1
        if self.plan.config is not None and not self.passes(lowered):
            return 1
        if self.plan.device is None:
            return self.reproduces_no_more()
        return self.compiled("code generator")

    def lowering(self, bound):
        """The lowered program if it agrees with the interpreter, else None (the culprit printed)."""
        from ref_interp.stripe_exec import run_stripe
        from stripe.lower import lower

        try:
            lowered = lower(bound)
            got = run_stripe(lowered, self.f.inputs)
        except Exception as e:  # a crash of the lowering is what the folder may be about
            print(f"lowered program: raised {type(e).__name__}: {e}{_where(e)}")
            print("culprit: the lowering (stripe.lower) or the Stripe interpreter (ref_interp.stripe_exec)")
            return None
        lines = differences(self.f.want, got, self.f.tol)
        if lines:
            print("lowered program: DIFFERS from the interpreter")
            _indent(lines)
            print("culprit: the lowering (stripe.lower), before any pass")
            return None
        print("lowered program: ok")
        return lowered

    def passes(self, lowered) -> bool:
        """Each pass step in turn; False at the first that differs, raises or fails to verify."""
        from ref_interp.stripe_exec import run_stripe
        from stripe.passes import PASSES, steps
        from stripe.verify import verify

        config = self.plan.config
        total = len(config.passes)
        it = steps(lowered, config)
        before = lowered
        for k, spec in enumerate(config.passes, 1):
            label = f"step {k}/{total} {spec.name} ({spec.pass_})"
            culprit = (
                f"culprit: pass step '{spec.name}' of config {config.name} (pass {spec.pass_}, "
                f"{PASSES[spec.pass_].fn.__module__}); the steps before it agree with the interpreter"
            )
            try:
                _, after, _ = next(it)
            except Exception as e:  # the pass itself crashed
                print(f"{label}: raised {type(e).__name__}: {e}{_where(e)}")
                print(culprit)
                return False
            try:
                verify(after)
            except Exception as e:
                print(f"{label}: its output fails stripe.verify: {e}")
                _indent(stripe_diff(before, after, spec.name, self.diff_lines))
                print(culprit)
                return False
            try:
                got = run_stripe(after, self.f.inputs)
            except Exception as e:
                print(
                    f"{label}: the program after it raised {type(e).__name__} in the Stripe interpreter: {e}"
                )
                _indent(stripe_diff(before, after, spec.name, self.diff_lines))
                print(culprit)
                return False
            lines = differences(self.f.want, got, self.f.tol)
            if lines:
                print(f"{label}: DIFFERS from the interpreter")
                _indent(lines)
                print(f"  Stripe before and after {spec.name}:")
                _indent(stripe_diff(before, after, spec.name, self.diff_lines))
                print(culprit)
                return False
            print(f"{label}: ok")
            before = after
        return True

    def compiled(self, what: str) -> int:
        """Run the target's compiled program; 1 (with the culprit named) if it differs."""
        import tile

        p = self.plan
        dev = p.device
        settings = {"config": p.config_arg} if p.config_arg else None
        if what == "code generator":
            agree = (
                "every pass step agrees"
                if p.config is not None and p.config.passes
                else "the lowering agrees"
            )
            blame = (
                f"{agree} with the interpreter, the compiled program does not: look at the code generator "
                f"of {p.target} (device {type(dev).__module__}.{type(dev).__name__}, compiler "
                f"{type(dev.compiler).__module__}.{type(dev.compiler).__name__}); TILE_DEBUG=3 prints the "
                "source it generates"
            )
        else:
            blame = f"{p.target} ({type(dev).__module__}) answers differently from the interpreter"
        try:
            got = tile.compile(self.f.source, p.target, settings)(self.f.inputs)
        except Exception as e:  # the target crashing is what the folder may be about
            print(f"compiled on {p.target}: raised {type(e).__name__}: {e}")
            print(f"culprit: {blame}")
            return 1
        lines = differences(self.f.want, got, self.f.tol)
        if lines:
            print(f"compiled on {p.target}: DIFFERS from the interpreter")
            _indent(lines)
            print(f"culprit: {blame}")
            return 1
        print(f"compiled on {p.target}: ok")
        return self.reproduces_no_more()

    def reproduces_no_more(self) -> int:
        print("nothing differs from the interpreter: the failure no longer reproduces")
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.bisect", description=__doc__.split("\n")[0])
    p.add_argument("dir", help="a folder under conformance/failures/")
    p.add_argument("--config", metavar="F.json", help="an optimizer config file or a built-in config's name")
    p.add_argument(
        "--target",
        metavar="ID",
        help="a device id, or stripe:CONFIG@STEP (default: the target recorded in the folder)",
    )
    p.add_argument(
        "--diff-lines", type=int, default=300, metavar="N", help="show at most N lines of diff (0: all)"
    )
    args = p.parse_args(argv)
    try:
        failure = load_failure(Path(args.dir))
        bisector = Bisector(failure, plan(failure, args.config, args.target), args.diff_lines)
        return bisector.run()
    except Unusable as e:
        print(str(e) if e.located else f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
