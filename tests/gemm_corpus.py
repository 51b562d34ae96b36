"""A corpus of tiled GEMM kernels, recorded so that a refactor of their code generators
(``backends.clike.tiled``, ``backends.cuda``'s schedule and renderer) is checked byte for byte
without a GPU.

Each case is a GEMM program (matmul, transposed operands, batched, a fused epilogue, convolutions
valid and padded), shapes (tile-aligned, odd, K not a whole number of steps), an element type and
precision (fp16, bf16, tf32, 3xtf32, fp32, fp64) and a device profile (no matrix unit, an
Ampere-class unit, a Hopper through OpenCL, a Hopper launching through CUDA with or without its
compute units known). Recording optimizes each program for its profile and keeps the optimized
Stripe text with the hashes of the generated kernels (``tests/gemm_corpus.json``), so the check
(``tests/test_gemm_schedule_corpus.py``) parses that Stripe and generates again: it depends on the
code generators only, not on the passes, which others may change.

    python -m tests.gemm_corpus --record       # rewrite the fixture from the current code
    python -m tests.gemm_corpus --dump DIR     # write every kernel's source under DIR (to diff)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import ml_dtypes
import numpy as np

FIXTURE = Path(__file__).resolve().parent / "gemm_corpus.json"

MM = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MM_AT = "function (A[K, M], B[K, N]) -> (C) { C[m, n : M, N] = +(A[k, m] * B[k, n]); }"
MM_BT = "function (A[M, K], B[N, K]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[n, k]); }"
BMM = "function (A[Q, M, K], B[Q, K, N]) -> (C) { C[q, m, n : Q, M, N] = +(A[q, m, k] * B[q, k, n]); }"
MLP = """function (X[B, I], W[I, O], Bias[O]) -> (Y) {
  Z[b, o : B, O] = +(X[b, i] * W[i, o]);
  Y = relu(Z + Bias);
}"""
VALID_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X - 2, Y - 2, CO] = +(I[n, x + i, y + j, ci] * F[i, j, ci, co]);
}"""
PADDED_CONV = """function (I[N, X, Y, CI], F[KX, KY, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(I[n, x + i - 1, y + j - 1, ci] * F[i, j, ci, co]);
}"""

PROGRAMS = {"mm": MM, "mm_at": MM_AT, "mm_bt": MM_BT, "bmm": BMM, "mlp": MLP, "conv": VALID_CONV,
            "padconv": PADDED_CONV}
DTYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64}

# shapes by program: (label, {input: shape})
SHAPES = {
    "mm": [("aligned", {"A": (1024, 2048), "B": (2048, 512)}), ("odd", {"A": (100, 70), "B": (70, 50)}),
           ("prime", {"A": (97, 67), "B": (67, 53)}), ("kstep", {"A": (256, 200), "B": (200, 256)}),
           ("big", {"A": (4096, 4096), "B": (4096, 4096)}),
           ("k4000", {"A": (512, 4000), "B": (4000, 512)})],
    "mm_at": [("aligned", {"A": (2048, 1024), "B": (2048, 512)}), ("odd", {"A": (70, 100), "B": (70, 50)}),
              ("prime", {"A": (67, 97), "B": (67, 53)})],
    "mm_bt": [("aligned", {"A": (1024, 2048), "B": (512, 2048)}), ("odd", {"A": (100, 72), "B": (50, 72)})],
    "bmm": [("aligned", {"A": (4, 512, 256), "B": (4, 256, 512)}),
            ("odd", {"A": (3, 60, 40), "B": (3, 40, 70)})],
    "mlp": [("aligned", {"X": (1024, 512), "W": (512, 1024), "Bias": (1024,)}),
            ("odd", {"X": (100, 70), "W": (70, 50), "Bias": (50,)})],
    "conv": [("aligned", {"I": (8, 34, 34, 64), "F": (3, 3, 64, 128)}),
             ("odd", {"I": (2, 11, 13, 5), "F": (3, 3, 5, 7)})],
    "padconv": [("aligned", {"I": (8, 32, 32, 64), "F": (3, 3, 64, 128)}),
                ("odd", {"I": (2, 11, 13, 5), "F": (3, 3, 5, 7)})],
}

# (dtype, precision setting or None)
PRECISIONS = [("f16", None), ("bf16", None), ("f32", None), ("f32", "tf32"), ("f32", "3xtf32")]
H100_LAUNCH = 227 * 1024
H100_UNITS = 132


@dataclass(frozen=True)
class Profile:
    """A device as the compile sees it: whether it keeps the matrix unit (``unit``: none, ``ampere``
    without warp-group products, ``hopper`` with them), the dynamic local memory it launches with
    (0: OpenCL only), its compute units (0: unknown) and its work-group limit."""

    unit: str
    launch_bytes: int = 0
    compute_units: int = 0
    threads: int = 1024


PROFILES = {
    "simt": Profile("none", threads=256),
    "ampere": Profile("ampere"),
    "hopper": Profile("hopper"),
    "launch": Profile("hopper", H100_LAUNCH),
    "launch_cu": Profile("hopper", H100_LAUNCH, H100_UNITS),
}


def cases() -> list[tuple[str, str, str, str, str | None, str]]:
    """(case id, program, shape label, dtype, precision, profile) of every recorded case."""
    out = []
    for prog, shapes in SHAPES.items():
        for label, _ in shapes:
            for dt, prec in PRECISIONS:
                profiles = ("ampere", "hopper", "launch", "launch_cu") if prog == "mm" else (
                    "ampere", "hopper", "launch_cu")
                for prof in profiles:
                    if prof == "launch_cu" and label in ("odd", "prime"):
                        continue  # odd shapes never stream: the same kernels as ``hopper``
                    out.append((f"{prog}-{label}-{dt}-{prec or 'plain'}-{prof}", prog, label, dt, prec, prof))
            if prog in ("mm", "bmm", "mlp", "padconv"):  # the SIMT kernel's float32 and float64 (no unit)
                for dt in ("f32", "f64"):
                    out.append((f"{prog}-{label}-{dt}-plain-simt", prog, label, dt, None, "simt"))
    out.append(("mm-aligned-f16-strict-hopper", "mm", "aligned", "f16", "strict", "hopper"))
    return out


def _hardware(prof: Profile):
    from tests.test_tensorize import fake_device

    def hardware(hw):
        if prof.unit == "none":
            units = {}
        else:
            cc = (9, 0) if prof.unit == "hopper" else (8, 0)
            dev = fake_device("NVIDIA Corporation", "cl_nv_device_attribute_query", cc, prof.launch_bytes)
            units = {k: dev.unit_here(u) for k, u in hw.matrix_units.items()}
        execs = {k: replace(u, threads=prof.threads) for k, u in hw.exec_units.items()}
        return replace(hw, matrix_units=units, exec_units=execs)

    return hardware


def optimized(src: str, shapes: dict, dtype, prec: str | None, prof: str):
    """``src`` at ``shapes`` and ``dtype`` optimized for ``prof``'s device with the ``precision``
    setting ``prec`` (``strict``: a strict build)."""
    from types import SimpleNamespace

    from backends.driver import config_for
    from stripe.passes import optimize
    from tests.pass_support import lowered

    dev = SimpleNamespace(optimizer="opencl_gpu", hardware=_hardware(PROFILES[prof]))
    cfg = config_for(dev, {"precision": prec} if prec not in (None, "strict") else {})
    return optimize(lowered(src, shapes, np.dtype(dtype)), cfg, strict=prec == "strict")


def optimized_text(prog: str, label: str, dt: str, prec: str | None, prof: str) -> str:
    """The case's program optimized for its profile, as Stripe text."""
    from stripe.printer import format_block

    return format_block(optimized(PROGRAMS[prog], dict(SHAPES[prog])[label], DTYPES[dt], prec, prof))


def units_of(prof: str) -> dict:
    """The matrix units a target of ``prof`` gets (the config's, as the profile's device keeps them)."""
    from stripe.config import target_config

    return dict(_hardware(PROFILES[prof])(target_config("opencl_gpu").hardware).matrix_units)


def target(prof: str, strict: bool = False):
    """The OpenCL target of ``prof``'s device (its matrix units, launch memory, compute units)."""
    from backends.opencl.target import OpenCLTarget

    p = PROFILES[prof]
    t = OpenCLTarget(fp64=True, fp16=True, exact_div=True, fast_math=False, half_extension=True,
                     contract=not strict)
    t.workgroups = True
    t.matrix_units = units_of(prof)
    t.launch_bytes = p.launch_bytes
    t.compute_units = p.compute_units
    return t


def generate_from_text(stripe_text: str, prof: str, strict: bool = False) -> list:
    """The kernels (``KernelSource``) of an optimized program's Stripe text on ``prof``'s target."""
    from backends.clike import generate
    from backends.driver import kernels
    from stripe.parser import parse_stripe

    return generate(target(prof, strict), kernels(parse_stripe(stripe_text)), {})


@dataclass(frozen=True)
class Nest:
    """A program's tensor-core GEMM kernel as its renderer gets it: the target, the GEMM, the
    kernel's parameters and pointers, its tiles, the unit, operation and mode its plan names, its
    fused epilogue and its name."""

    t: object
    g: object
    ptrs: dict
    params: list
    tiles: object
    unit: object
    op: object
    mode: str
    epilogue: object
    symbol: str

    def plan(self, t=None):
        """The schedule ``backends.cuda.schedule.plan`` makes of it (on target ``t``: another)."""
        from backends.cuda.schedule import plan

        return plan(t or self.t, self.g, self.ptrs, self.params, self.tiles, self.unit, self.op, self.mode)

    def render(self, schedule) -> str:
        """``schedule`` printed (``backends.cuda.render.Render``)."""
        from backends.cuda.render import Render

        return Render(self.t, self.g, self.ptrs, schedule, self.epilogue).source(self.symbol, self.params)[0]


def nest_of(src: str, shapes: dict, dtype, prec: str | None = None, prof: str = "hopper") -> Nest:
    """The tensor-core GEMM kernel of ``src`` optimized for ``prof`` (``optimized``)."""
    from backends.clike.gemm_writer import Tiles
    from backends.clike.kernel import KernelEmitter
    from backends.cuda.schedule import operation
    from backends.driver import kernels
    from stripe.gemm_nest import read
    from stripe.plans import GemmPlan
    from tile.dtypes import DType

    t = target(prof)
    for k, info in enumerate(kernels(optimized(src, shapes, dtype, prec, prof))):
        em = KernelEmitter(t, k, info, {b: DType(str(d)) for b, d in zip(info.buffers, info.buffer_dtypes)})
        em.begin()
        nest = read(em.block) if isinstance(em.block.plan, GemmPlan) else None
        if nest is not None and nest.shape.unit:
            found = operation(t.matrix_units, nest.shape.unit)
            assert found is not None, nest.shape.unit
            return Nest(t, nest.gemm, em.ptrs, em.params, Tiles.of(nest), *found, em.epilogue(nest.gemm),
                        f"{em.symbol}_{nest.shape.suffix}")
    raise AssertionError("no kernel on the matrix unit")


def record_of(k) -> dict:
    """What the fixture keeps of one kernel: its name, its text's hash and length, its sizes and
    launch record."""
    return {
        "name": k.name, "sha256": hashlib.sha256(k.text.encode()).hexdigest(), "chars": len(k.text),
        "work_items": k.work_items, "local": k.local,
        "launch": json.loads(json.dumps(k.launch)) if k.launch is not None else None,
    }


def record() -> dict:
    """The fixture: ``programs`` (each distinct optimized Stripe text, by its hash's first 16 hex
    digits: profiles often optimize alike) and ``cases`` (per case its profile, its program's key
    and its kernels' records)."""
    programs, out = {}, {}
    for cid, prog, label, dt, prec, prof in cases():
        text = optimized_text(prog, label, dt, prec, prof)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        programs[key] = text
        ks = generate_from_text(text, prof, strict=prec == "strict")
        out[cid] = {"profile": prof, "strict": prec == "strict", "program": key,
                    "kernels": [record_of(k) for k in ks]}
    return {"programs": programs, "cases": out}


def load() -> dict:
    """Per case id: its profile, whether strict, its optimized Stripe text and kernel records."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return {cid: {**c, "stripe": data["programs"][c["program"]]} for cid, c in data["cases"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="rewrite tests/gemm_corpus.json")
    ap.add_argument("--dump", metavar="DIR", help="write every kernel's source from the fixture's Stripe")
    args = ap.parse_args()
    if args.record:
        FIXTURE.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    if args.dump:
        d = Path(args.dump)
        d.mkdir(parents=True, exist_ok=True)
        for cid, case in load().items():
            for k in generate_from_text(case["stripe"], case["profile"], case["strict"]):
                (d / f"{cid}.{k.name}.cl").write_text(k.text, encoding="utf-8")


if __name__ == "__main__":
    main()
