"""``python -m tile <command>``: the language's command line.

* ``check F.tile [--shape I=2x3[:dtype] ...]`` — parse and type-check; print every tensor's
  inferred dtype and shape (symbolic in the input dimensions where no ``--shape`` is given).
* ``grad F.tile [--wrt A,B] [--emit] [--inputs IN.npz] [--shape ...] [--output GRADS.npz]`` —
  ``--emit`` prints the gradient program; otherwise the interpreter computes the gradient of the
  sum of the outputs and prints (and saves) arrays named ``grad_<Input>``.
* ``emit F.tile --stage reduced|defracted|flat|flat-tile|stripe|optimized [--inputs IN.npz] [--shape ...]``
  — print the program after a transform, lowered to Stripe, or optimized by a target's passes
  (``--target ID`` or ``--config F.json``, ``--after STEP``, ``--strict``, ``--report`` for the
  cost model's estimate); sizes come from the given or made-up inputs; ``flat-tile`` is the flat
  stage as runnable Tile over 1-D views of the tensors.
* ``devices`` — every target: ``interp`` and each device (``llvm_cpu.0``, ..., and those of
  ``tile.devices`` plugins), then each entry point or device that gave none and why.
* ``serve --target ID`` — serve a device over the external-backend protocol on stdin and stdout
  (``backends.external``; the reference implementation of the protocol).
* ``run F.tile --target ID [--inputs IN.npz] [--shape ...] [--output OUT.npz] [--no-cache]
  [--max-buffer-bytes N] [--max-total-bytes N] [--repeat N]`` — compile for a target and run; the
  byte limits lower the device's memory limits (docs/semantics.md §8.4) and are checked before any
  input is made up. It prints the compile time and the first call's time apart (the first call
  includes one-time start-up); ``--repeat N`` runs N more calls and prints their best and median
  time and rate (GFLOP/s for contractions, else GB/s).

Output is a pipe's like any Unix tool's: ``python -m tile emit ... | head`` ends quietly, and so
does Ctrl-C (exit status 130, as a shell reports SIGINT). A likely
index typo (``tile.lint``) is a located ``warning:`` on stderr; ``python -W ignore::UserWarning -m
tile ...`` silences it.
* ``tune F.tile --target ID [--shape ...] [--config F.json] [--candidates N] [--retune]`` — time
  the cost model's best tilings on the device and cache the fastest, which ``tile.compile(...,
  settings={"tune": True})`` then uses (``backends.tune``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

from tile.errors import TileDeviceError, TileError, TileInputError, TileWarning
from tile.inputs import (
    PRECISION_HELP,
    Limits,
    add_input_arguments,
    check_writable,
    interrupted,
    parse_shape_spec,
    quiet_broken_pipe,
)
from tile.parser import parse_file
from tile.precision import PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tile", description="The Tile tensor language.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="parse and type-check a .tile program, print inferred shapes")
    c.add_argument("file")
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=2x3[:dtype]",
        help="a concrete input shape and dtype (repeatable); others stay symbolic",
    )
    g = sub.add_parser("grad", help="differentiate a .tile program (Tile to Tile)")
    g.add_argument("file")
    add_input_arguments(g)
    g.add_argument(
        "--wrt", help="comma-separated inputs to differentiate with respect to (default: float inputs)"
    )
    g.add_argument("--emit", action="store_true", help="print the gradient program instead of running it")
    g.add_argument("--precision", choices=PRECISIONS, default="native", help=PRECISION_HELP)
    g.add_argument("--output", help="write grad_<Input> arrays to this .npz archive")
    e = sub.add_parser(
        "emit",
        help="print a program after a transform stage, or (--stage config) a target config resolved",
    )
    e.add_argument("file", nargs="?", help="the .tile program (not needed for --stage config)")
    stages = ("tile", "reduced", "defracted", "flat", "flat-tile", "stripe", "optimized", "config")
    e.add_argument(
        "--stage",
        choices=stages,
        required=True,
        help="optimized and config use --config if given, else the built-in config of --target "
        "(default llvm_cpu.0: the llvm_cpu config)",
    )
    add_input_arguments(e, "an .npz archive giving the input shapes and dtypes")
    e.add_argument(
        "--target",
        default="llvm_cpu.0",
        help="optimized: whose built-in config (default llvm_cpu.0, whose config is llvm_cpu; also "
        "opencl_gpu, accel, ...; a device id works, and its reported sizes are used when it is present)",
    )
    e.add_argument(
        "--config", metavar="F.json", help="optimized: your own target config file (or a built-in config)"
    )
    e.add_argument("--after", metavar="STEP", help="optimized: stop after this pass step (name or pass)")
    e.add_argument(
        "--strict",
        action="store_true",
        help="stripe, optimized: as strict mode compiles (no pass reorders aggregation; float16 and "
        "bfloat16 matrix products sum in float32)",
    )
    e.add_argument(
        "--report", action="store_true", help="optimized: also print the cost model's estimate per kernel"
    )
    d = sub.add_parser("devices", help="list every target: the interpreter and compiled devices")
    d.add_argument(
        "--require",
        metavar="PREFIX",
        action="append",
        default=[],
        help="exit with status 1 unless a device id starts with PREFIX (e.g. opencl_cpu); repeatable",
    )
    d.add_argument(
        "--fresh",
        action="store_true",
        help="probe every device now, not the listing kept from the last probe (backends/listing.py)",
    )
    r = sub.add_parser("run", help="compile a .tile program for a target and run it")
    r.add_argument("file")
    add_input_arguments(r)
    r.add_argument("--target", default="llvm_cpu.0", help="a device id from `devices` (default llvm_cpu.0)")
    r.add_argument("--output", help="write every output to this .npz archive")
    r.add_argument("--no-cache", action="store_true", help="compile afresh, bypassing the kernel cache")
    r.add_argument(
        "--config", metavar="F.json", help="optimize with this config file (or a built-in: llvm_cpu_tiled)"
    )
    r.add_argument("--strict", action="store_true", help="keep every aggregation in the interpreter's order")
    limits = (("--max-buffer-bytes", "any one buffer"), ("--max-total-bytes", "all buffers together"))
    for flag, what in limits:
        r.add_argument(
            flag,
            type=_byte_count,
            metavar="N",
            help=f"refuse to run when {what} would need more than N bytes (lowers the device's limit; "
            "suffixes K, M, G: powers of 1024)",
        )
    r.add_argument(
        "--repeat",
        type=_positive,
        metavar="N",
        help="after the first call, time N more calls and print their best and median time and rate",
    )
    v = sub.add_parser(
        "serve",
        help="serve a device over the external-backend protocol on stdin/stdout (docs/new_target.md)",
    )
    v.add_argument("--target", default="llvm_cpu.0", help="a device id from `devices` (default llvm_cpu.0)")
    v.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="exit when no request comes for S seconds"
    )
    t = sub.add_parser("tune", help="time the cost model's best tilings on a device, cache the fastest")
    t.add_argument("file")
    add_input_arguments(t, "an .npz archive giving the input shapes and dtypes")
    t.add_argument("--target", default="llvm_cpu.0", help="a device id from `devices` (default llvm_cpu.0)")
    t.add_argument("--config", metavar="F.json", help="tune this config (or a built-in: opencl_gpu_tiled)")
    t.add_argument("--candidates", type=int, default=4, help="tilings timed per block (default 4)")
    t.add_argument("--retune", action="store_true", help="time again even when the cache has a choice")
    t.add_argument("--strict", action="store_true", help="keep every aggregation in the interpreter's order")
    o = sub.add_parser("onnx", help="import an ONNX model: print its Tile program (--emit) or run it")
    o.add_argument("file", metavar="model.onnx")
    o.add_argument("--emit", action="store_true", help="print the Tile program instead of running it")
    o.add_argument("--target", default="llvm_cpu.0", help="a target id from `devices` (default llvm_cpu.0)")
    o.add_argument("--inputs", metavar="in.npz", help="the model's inputs, by name")
    o.add_argument("--output", metavar="out.npz", help="save the outputs, by name")
    return p


def _byte_count(text: str) -> int:
    """``--max-buffer-bytes`` and ``--max-total-bytes``: a positive byte count, ``4096``, ``64K``,
    ``512M`` or ``2G`` (powers of 1024); argparse reports anything else as a usage error."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    digits, scale = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units else (text, 1)
    if not digits.isdigit() or int(digits) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive byte count (e.g. 4096, 64K, 2G), not '{text}'")
    return int(digits) * scale


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not '{text}'")
    return int(text)


def cmd_devices(args) -> int:
    from backends.listing import listing

    found = listing(fresh=args.fresh)  # kept on disk between runs, keyed by versions and hardware
    width = max([12, *(len(d.id) for d in found.devices)])
    print(f"{'interp':<{width}} the exact reference interpreter (all dtypes)")
    for dev in found.devices:
        takes = f", takes {dev.stage} programs" if dev.stage else ""
        print(
            f"{dev.id:<{width}} {dev.description} (fp64: {'yes' if dev.fp64 else 'no'}, "
            f"fp16: {'yes' if dev.fp16 else 'no'}{takes})"
        )
    for kind, why in found.unavailable.items():
        name = kind if "." in kind or " " in kind or ":" in kind else kind + ".*"
        print(f"{name:<{width}} unavailable: {why}")
    missing = [p for p in args.require if not any(i.startswith(p) for i in found.ids())]
    for prefix in missing:
        print(f"error: no available device whose id starts with '{prefix}'", file=sys.stderr)
    return 1 if missing else 0


def cmd_serve(args) -> int:
    from backends.external.server import serve

    return serve(args.target, timeout=args.timeout)


def cmd_run(args) -> int:
    from tile.api import compile as compile_program
    from tile.inputs import describe, gather_inputs, load_npz

    program = parse_file(args.file)
    check_writable(args.output)
    settings = {"cache": not args.no_cache, "strict": args.strict}
    if args.config:
        settings["config"] = args.config
    for key in ("max_buffer_bytes", "max_total_bytes"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    try:
        exe = compile_program(program, args.target, settings)
    except TileDeviceError as e:
        print(e, file=sys.stderr)
        return 2
    given = load_npz(args.inputs) if args.inputs else {}
    inputs = gather_inputs(program, given, args.shape, args.seed, _limits(args))
    start = time.perf_counter()
    compiled = exe.prepare(inputs)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    outputs = exe(inputs)
    first_s = time.perf_counter() - start
    times = []
    for _ in range(args.repeat or 0):
        start = time.perf_counter()
        outputs = exe(inputs)
        times.append(time.perf_counter() - start)
    for name, arr in outputs.items():
        print(f"{name}: {arr.dtype}{list(arr.shape)}")
        print("  " + describe(arr).replace("\n", "\n  "))
    if args.repeat:
        print(f"compile: {compile_s:.3f} s; first call: {_ms(first_s)} (includes one-time start-up)")
        best, median = min(times), statistics.median(times)
        rate = _rates(compiled, best, median)
        print(f"{len(times)} calls after the first: best {_ms(best)}, median {_ms(median)}{rate}")
    if args.output:
        import numpy as np

        try:
            np.savez(args.output, **outputs)
        except OSError as e:
            print(TileInputError(f"cannot write '{args.output}': {e.strerror}"), file=sys.stderr)
            return 1
    return 0


def _limits(args) -> Limits:
    """What made-up inputs must fit on the target: ``--max-buffer-bytes``, ``--max-total-bytes``
    and the device's own memory limits, the smallest of each."""
    from backends import registry

    if args.target == "interp":
        return _interp_limits()
    per, total = [], []
    try:
        mem = registry.get(args.target).memory_bytes()
    except (TileError, AttributeError):
        mem = None  # the interpreter, or a device without memory limits of its own
    if mem is not None:
        per += [(n, mem.what) for n in (mem.per_buffer, mem.total) if n is not None]
        total += [(mem.total, mem.what)] if mem.total is not None else []
    if getattr(args, "max_buffer_bytes", None) is not None:
        per.append((args.max_buffer_bytes, "--max-buffer-bytes"))
    if getattr(args, "max_total_bytes", None) is not None:
        total.append((args.max_total_bytes, "--max-total-bytes"))
    return Limits(min(per) if per else None, min(total) if total else None)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _rates(compiled, best: float, median: float) -> str:
    """``, 210.3 GFLOP/s at best, 205.1 median`` from the kernels' work (2 FLOP a multiply-add of
    the contractions; else the bytes the kernels read and write), or nothing without kernels."""
    infos = getattr(compiled, "infos", None)
    if not infos:
        return ""
    flops = sum(i.flops for i in infos if i.block.has_tags("contraction"))
    work, unit = (flops / 1e9, "GFLOP/s") if flops else (sum(i.bytes for i in infos) / 1e9, "GB/s")
    if not work:
        return ""
    return f"; {work / best:.2f} {unit} at best, {work / median:.2f} at the median"


def cmd_tune(args) -> int:
    from backends import driver, registry
    from backends.tune import tune
    from tile.inputs import gather_inputs, load_npz

    program = parse_file(args.file)
    arrays = gather_inputs(program, load_npz(args.inputs) if args.inputs else {}, args.shape, args.seed,
                           _limits(args))
    bound = driver.bind_inputs(program, arrays)
    try:
        device = registry.get(args.target)
    except TileDeviceError as e:
        print(e, file=sys.stderr)
        return 2
    settings = {"tune": True, "strict": args.strict, "tune_candidates": args.candidates,
                "tune_refresh": args.retune, **({"config": args.config} if args.config else {})}
    config = driver.config_for(device, settings) if hasattr(device, "compiler") else None
    if config is None:
        print(f"{args.target} compiles without an optimizer config: nothing to tune")
        return 0

    def report(t) -> None:
        took = f"{t.seconds * 1e3:.3f} ms" if t.seconds is not None else f"not timed: {t.error}"
        print(f"{t.step} {t.block}: candidate {t.rank} tiles {'x'.join(map(str, t.tiles))}: {took}")

    tuning = tune(bound, device, config, settings, report)
    chosen = {f"{s}/{b}": rank for s, blocks in tuning.choices.items() for b, rank in blocks.items()}
    chosen.update(tuning.settings)  # the code generator's own knobs (Device.tuning_space)
    if not chosen:
        print(f"keeping the defaults: config '{config.name}' autotiles no block of this program, or "
              "the device's own choices were fastest")
    else:
        where = "from the cache" if tuning.cached else "stored"
        print(f"chosen ({where}: {tuning.path}): {', '.join(f'{k} = {v}' for k, v in chosen.items())}")
    return 0


def cmd_emit(args) -> int:
    from backends import driver
    from tile.inputs import gather_inputs, load_npz

    device = _present_device(args.target) if args.stage in ("optimized", "config") else None
    if args.stage == "config":
        print(driver.config_text(args.target, device, args.config), end="")
        return 0
    if args.file is None:
        print(f"error: emit --stage {args.stage} needs a .tile file", file=sys.stderr)
        return 2
    program = parse_file(args.file)
    given = load_npz(args.inputs) if args.inputs else {}
    bound = driver.bind_inputs(program, gather_inputs(program, given, args.shape), check=False)
    text = driver.emit(
        bound,
        args.stage,
        target=args.target,
        device=device,
        config=args.config,
        after=args.after,
        strict=args.strict,
        report=args.report,
    )
    print(text, end="")
    return 0


def _present_device(target: str):
    """The device ``target`` names when it is a device id that works here, else None."""
    if "." not in target:
        return None
    from backends import registry

    try:
        return registry.get(target)
    except TileDeviceError:
        return None


def cmd_grad(args) -> int:
    from tile.api import grad_values
    from tile.autodiff import gradient
    from tile.inputs import describe, gather_inputs, load_npz
    from tile.printer import format_program

    program = parse_file(args.file)
    check_writable(args.output)
    wrt = [w.strip() for w in args.wrt.split(",")] if args.wrt else None
    if args.emit:
        dtypes = {}
        shapes = {}
        for spec in args.shape:
            name, shape, dtype = parse_shape_spec(spec)
            shapes[name], dtypes[name] = shape, dtype
        g = gradient(program, wrt, dtypes=dtypes, shapes=shapes)
        for note in g.notes:
            print(f"// note: {note}")
        print(format_program(g.program), end="")
        return 0
    given = load_npz(args.inputs) if args.inputs else {}
    inputs = gather_inputs(program, given, args.shape, args.seed, _interp_limits())
    grads = grad_values(program, inputs, wrt, precision=args.precision)
    for name, arr in grads.items():
        print(f"grad_{name}: {arr.dtype}{list(arr.shape)}")
        print("  " + describe(arr).replace("\n", "\n  "))
    if args.output:
        import numpy as np

        saved = {f"grad_{k}": (v.astype(np.float64) if v.dtype == object else v) for k, v in grads.items()}
        try:
            np.savez(args.output, **saved)
        except OSError as e:
            print(TileInputError(f"cannot write '{args.output}': {e.strerror}"), file=sys.stderr)
            return 1
    return 0


def _interp_limits() -> Limits:
    """The interpreter's: no input larger than its index-space limit (``TILE_INTERP_MAX_POINTS``)."""
    from ref_interp.contraction import max_points_default

    return Limits(elements=(max_points_default(), "the interpreter's limit"))


def cmd_check(args) -> int:
    from tile import lint
    from tile.bind import bind_symbolic  # (sympy: not for --help)

    program = parse_file(args.file)
    shapes, dtypes = {}, {}
    for spec in args.shape:
        name, shape, dtype = parse_shape_spec(spec)
        shapes[name], dtypes[name] = shape, dtype
    bound = bind_symbolic(program, dtypes, shapes)
    outputs = set(bound.outputs)
    width = max((len(n) for n in bound.types), default=0)
    for name, t in bound.types.items():
        role = "input" if name in dict(bound.inputs) else "output" if name in outputs else ""
        print(f"{name:<{width}}  {t}  {role}".rstrip())
    for note in bound.notes:
        print(f"note: {note}")
    lint.warn(program)
    print(f"ok: {args.file}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "file", None) is not None:
            with open(args.file, encoding="utf-8"):
                pass
    except OSError as e:
        print(f"error: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    commands = {
        "check": cmd_check,
        "grad": cmd_grad,
        "emit": cmd_emit,
        "devices": cmd_devices,
        "run": cmd_run,
        "tune": cmd_tune,
        "serve": cmd_serve,
        "onnx": cmd_onnx,
    }
    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return commands[args.command](args)
    except TileError as e:
        print(e, file=sys.stderr)
        return 1
    except BrokenPipeError:
        return quiet_broken_pipe()
    except KeyboardInterrupt:
        return interrupted()
    finally:
        warnings.showwarning = shown


def cmd_onnx(args: argparse.Namespace) -> int:
    from tile.onnx.cli import main as onnx_main

    return onnx_main(args)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A ``TileWarning`` as a located ``warning:`` (its own text); others as Python shows them."""
    if isinstance(message, TileWarning):
        print(message, file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
