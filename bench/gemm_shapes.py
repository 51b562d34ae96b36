"""Every GEMM shape against PyTorch (cuBLAS, cuDNN): issue 41's "every shape at cuBLAS speed", one run.

``python -m bench.gemm_shapes [DEVICE] [--quick] [--held-out] [--seed S] [--budget SECONDS]
[--json PATH]`` times, for each case, Tile on ``DEVICE`` (default ``cuda.0``: resident tensors,
best of ``--reps`` around a call and its ``wait()``) against PyTorch on the same data (best of
``--reps`` around the op and ``torch.cuda.synchronize()``; ``cudnn.benchmark`` on; TF32 allowed
only in the tf32 rows; convolutions NHWC, channels-last in PyTorch), and reports the ratio PyTorch
time / Tile time with both max errors against a float64 result of the same data (PyTorch in
float64). The goal: ratio >= 0.8 (3xtf32 against cuBLAS float32: >= 1.2), Tile's error <= the
peer's. Categories, several sizes each:

* ``small_m``: decode-like M = 1, 2, 8, 16, 33, 64 rows, N and K in the thousands (K = 11008 too);
* ``unaligned``: M, N, K like 4097, 3001, 1000 (rows of an odd length, or only tiles overhanging);
* ``square``: 512³, 1000³, 2048³, 4096³ (float16);
* ``batched``: many small (512 x 64³, 64 x 512x64x512) to few large (16 x 1024³);
* ``precision``: bfloat16, tf32 (against cuBLAS tf32) and 3xtf32 (against cuBLAS float32) at
  aligned and unaligned sizes (3001, 4097);
* ``conv``: 3x3 beyond the 56x56 stem (7x7x512 -> 512 batch 8, 14x14x256), 1x1, stride 2,
  grouped (32 groups), depthwise.

``--quick``: one or two cases a category (about a minute on an H100). ``--held-out``: sizes drawn
from a seeded generator (``--seed``), none of them the listed ones, ``--per-category`` a category,
so the goals are judged on shapes nobody tuned for. ``--budget``: no case starts once the time
spent plus the slowest case so far would pass it (the device's calls stop at 600 s); the cases
left are listed as skipped. Prints a Markdown table; ``--json PATH`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from bench.cases import CONV1X1, CONV3X3, CONV_STRIDED
from bench.tensor_cores import MATMUL, Case, best

BMM = "function (X[G, M, L], Y[G, L, N]) -> (C) { C[g, i, j: G, M, N] = +(X[g, i, k] * Y[g, k, j]); }"
GROUPED = """function (I[N, H, W, G, CG], K[KH, KW, CG, G, CO]) -> (O) {
    O[n, x, y, g, co: N, H, W, G, CO] = +(I[n, x + kx - 1, y + ky - 1, g, ci] * K[kx, ky, ci, g, co]);
}"""
DEPTHWISE = """function (I[N, H, W, C], K[KH, KW, C]) -> (O) {
    O[n, x, y, c: N, H, W, C] = +(I[n, x + kx - 1, y + ky - 1, c] * K[kx, ky, c]);
}"""
CATEGORIES = ("small_m", "unaligned", "square", "batched", "precision", "conv")
CONVS = ("conv3x3", "conv1x1", "stride2", "grouped", "depthwise")
GOAL, GOAL_3XTF32 = 0.8, 1.2


@dataclass(frozen=True)
class Spec:
    """One case: ``kind`` (``mm``: dims M, N, K; ``bmm``: batch, M, K, N; a convolution of
    ``CONVS``: batch, H, W, input channels, output channels, with ``groups``), the element type
    and Tile's precision mode (``tf32``, ``3xtf32`` or None)."""

    category: str
    kind: str
    dims: tuple[int, ...]
    dtype: str = "float16"
    precision: str | None = None
    groups: int = 1

    @property
    def label(self) -> str:
        mode = self.precision or self.dtype.replace("float", "fp").replace("bfp", "bf")
        if self.kind == "mm":
            return "{} matmul {}x{}x{}".format(mode, *self.dims)
        if self.kind == "bmm":
            return "{} bmm {} x {}x{}x{}".format(mode, *self.dims)
        n, h, w, ci, co = self.dims
        group = f" g{self.groups}" if self.kind == "grouped" else ""
        return f"{mode} {self.kind}{group} b{n} {h}x{w}x{ci}->{co}"

    @property
    def flops(self) -> float:
        if self.kind == "mm":
            m, n, k = self.dims
            return 2.0 * m * n * k
        if self.kind == "bmm":
            return 2.0 * math.prod(self.dims)
        n, h, w, ci, co = self.dims
        taps = 1 if self.kind == "conv1x1" else 9
        out = n * h * w * co / (4 if self.kind == "stride2" else 1)
        return 2.0 * out * taps * ci / self.groups

    @property
    def goal(self) -> float:
        return GOAL_3XTF32 if self.precision == "3xtf32" else GOAL

    @property
    def peer(self) -> str:
        lib = "cuDNN" if self.kind not in ("mm", "bmm") else "cuBLAS"
        mode = {"tf32": "tf32", "3xtf32": "fp32"}.get(self.precision or "", self.dtype)
        return f"{lib} {mode.replace('bfloat', 'bf').replace('float', 'fp')}"


def _mm(category, m, n, k, dtype="float16", precision=None):
    return Spec(category, "mm", (m, n, k), dtype, precision)


def listed() -> list[Spec]:
    """The issue's sizes and the ones named beside them."""
    specs = [_mm("small_m", m, 4096, 4096) for m in (1, 2, 8, 16, 33, 64)]
    specs += [_mm("small_m", 16, 4096, 11008), _mm("small_m", 16, 11008, 4096)]
    specs += [_mm("unaligned", *d) for d in ((4097, 4097, 4097), (3001, 3001, 3001), (1000, 4097, 3001),
                                               (4096, 4096, 4097), (4097, 4096, 4096), (3000, 3000, 3000))]
    specs += [_mm("square", n, n, n) for n in (512, 1000, 2048, 4096)]
    batched = ((512, 64, 64, 64), (64, 512, 64, 512), (16, 1024, 1024, 1024))
    specs += [Spec("batched", "bmm", d) for d in batched]
    specs += [_mm("precision", 4096, 4096, 4096, "bfloat16"), _mm("precision", 3001, 3001, 3001, "bfloat16"),
              _mm("precision", 3000, 3000, 3000, "float32", "tf32"),
              _mm("precision", 4097, 4097, 4097, "float32", "tf32"),
              _mm("precision", 2048, 2048, 2048, "float32", "3xtf32"),
              _mm("precision", 3000, 3000, 3000, "float32", "3xtf32"),
              _mm("precision", 3001, 3001, 3001, "float32", "3xtf32")]
    specs += [Spec("conv", "conv3x3", (8, 7, 7, 512, 512)), Spec("conv", "conv3x3", (32, 14, 14, 256, 256)),
              Spec("conv", "conv1x1", (32, 56, 56, 256, 64)), Spec("conv", "stride2", (32, 56, 56, 128, 128)),
              Spec("conv", "grouped", (32, 56, 56, 128, 128), groups=32),
              Spec("conv", "depthwise", (32, 56, 56, 128, 128), groups=128)]
    return specs


QUICK = ("fp16 matmul 16x4096x4096", "fp16 matmul 4097x4097x4097", "fp16 matmul 4097x4096x4096",
         "fp16 matmul 1000x1000x1000",
         "fp16 bmm 64 x 512x64x512", "bf16 matmul 3001x3001x3001", "tf32 matmul 3000x3000x3000",
         "3xtf32 matmul 2048x2048x2048", "fp16 conv3x3 b8 7x7x512->512", "fp16 depthwise b32 56x56x128->128")


def quick() -> list[Spec]:
    return [s for s in listed() if s.label in QUICK]


def held_out(seed: int, per_category: int = 2) -> list[Spec]:
    """``per_category`` cases a category at sizes drawn from ``seed``, none of them listed."""
    rng = np.random.default_rng(seed)
    taken = {(s.kind, s.dims, s.dtype, s.precision) for s in listed()}
    out: list[Spec] = []
    for category in CATEGORIES:
        got = 0
        while got < per_category:
            spec = _draw(category, rng)
            key = (spec.kind, spec.dims, spec.dtype, spec.precision)
            if key not in taken and spec.flops <= 4e11:
                taken.add(key)
                out.append(spec)
                got += 1
    return out


def _draw(category: str, rng: np.random.Generator) -> Spec:
    def between(lo: int, hi: int, step: int = 1) -> int:
        return int(rng.integers(lo // step, hi // step + 1)) * step

    if category == "small_m":
        return _mm(category, between(1, 64), between(1024, 12288, 64), between(1024, 12288, 64))
    if category == "unaligned":
        return _mm(category, between(700, 5000), between(700, 5000), between(700, 5000))
    if category == "square":
        n = between(256, 3072, 8)
        return _mm(category, n, n, n)
    if category == "batched":
        return Spec(category, "bmm", (2 ** between(1, 9), between(32, 1024, 16), between(32, 1024, 16),
                                      between(32, 1024, 16)))
    if category == "precision":
        dtype, precision = [("bfloat16", None), ("float32", "tf32"), ("float32", "3xtf32"),
                            ("float16", None)][between(0, 3)]
        return _mm(category, between(1000, 4500), between(1000, 4500), between(1000, 4500), dtype, precision)
    kind = CONVS[between(0, len(CONVS) - 1)]
    hw, ci = (7, 13, 14, 17, 28, 56)[between(0, 5)], between(64, 512, 32)
    hw += hw % 2 if kind == "stride2" else 0  # (the program's output is H / 2)
    co = ci if kind == "depthwise" else between(64, 512, 32)
    groups = {"depthwise": ci, "grouped": (2, 4, 8, 16, 32)[between(0, 4)]}.get(kind, 1)
    return Spec(category, kind, (between(1, 32), hw, hw, ci, co), groups=groups)


# ------------------------------------------------------------------------------ one case
def inputs(spec: Spec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Standard normal data in the case's element type, in Tile's layout (NHWC, HWIO)."""
    dt = ml_dtypes.bfloat16 if spec.dtype == "bfloat16" else np.dtype(spec.dtype)

    def draw(*shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dt)

    if spec.kind == "mm":
        m, n, k = spec.dims
        return {"A": draw(m, k), "B": draw(k, n)}
    if spec.kind == "bmm":
        b, m, k, n = spec.dims
        return {"X": draw(b, m, k), "Y": draw(b, k, n)}
    n, h, w, ci, co = spec.dims
    if spec.kind == "conv1x1":
        return {"I": draw(n, h, w, ci), "K": draw(ci, co)}
    if spec.kind == "grouped":
        g = spec.groups
        return {"I": draw(n, h, w, g, ci // g), "K": draw(3, 3, ci // g, g, co // g)}
    if spec.kind == "depthwise":
        return {"I": draw(n, h, w, ci), "K": draw(3, 3, ci)}
    return {"I": draw(n, h, w, ci), "K": draw(3, 3, ci, co)}


def program(spec: Spec) -> str:
    return {"mm": MATMUL, "bmm": BMM, "conv3x3": CONV3X3, "conv1x1": CONV1X1, "stride2": CONV_STRIDED,
            "grouped": GROUPED, "depthwise": DEPTHWISE}[spec.kind]


def peer(spec: Spec, t: dict) -> tuple[Callable[[], object], Callable[[object], object]]:
    """PyTorch's op on tensors ``t`` (Tile's layouts; layout changes made here, outside the timed
    call) and the map of its result to Tile's output layout."""
    import torch

    F = torch.nn.functional
    if spec.kind == "mm":
        return (lambda: t["A"] @ t["B"]), (lambda y: y)
    if spec.kind == "bmm":
        return (lambda: torch.bmm(t["X"], t["Y"])), (lambda y: y)
    cl = torch.channels_last
    n, h, w, ci, co = spec.dims
    x = t["I"].reshape(n, h, w, ci).permute(0, 3, 1, 2)  # NHWC memory: channels-last NCHW
    if spec.kind == "conv1x1":
        k = t["K"].t()[:, :, None, None].contiguous(memory_format=cl)
    elif spec.kind == "grouped":
        k = t["K"].permute(3, 4, 2, 0, 1).reshape(co, ci // spec.groups, 3, 3).contiguous(memory_format=cl)
    elif spec.kind == "depthwise":
        k = t["K"].permute(2, 0, 1)[:, None].contiguous(memory_format=cl)
    else:
        k = t["K"].permute(3, 2, 0, 1).contiguous(memory_format=cl)
    stride, pad = (2 if spec.kind == "stride2" else 1), (0 if spec.kind == "conv1x1" else 1)

    def back(y):
        y = y.permute(0, 2, 3, 1)
        return y.reshape(*y.shape[:3], spec.groups, -1) if spec.kind == "grouped" else y

    return (lambda: F.conv2d(x, k, stride=stride, padding=pad, groups=spec.groups)), back


def max_error(got: np.ndarray, exact: np.ndarray) -> float:
    """max |got - exact| in float64 (inf where either is not finite and they differ)."""
    d = np.abs(np.asarray(got).astype(np.float64) - np.asarray(exact, dtype=np.float64))
    return float(np.where(np.isnan(d), np.inf, d).max()) if d.size else 0.0  # (inf stays inf)


def torch_seconds(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> float:
    def go():
        fn()
        sync()

    return best(go, reps)


def measure(spec: Spec, device: str, torch_device: str, reps: int, seed: int = 0,
            config: str | None = None) -> dict:
    """One row: both times, the ratio, both max errors against PyTorch in float64, Tile's kernels
    (``config``: Tile's optimizer config, a path or a built-in name; default the device's)."""
    import torch

    arrays = inputs(spec, np.random.default_rng(seed))
    case = Case(device, program(spec), arrays, spec.precision, config)
    t_tile = case.seconds(reps)
    got = case.result()
    try:  # the kernels of the last call (a device without profiling names none)
        kernels = [name for name, _ in case.f.profile()]
    except Exception:  # noqa: BLE001 - a note, not a result
        kernels = []
    tf = {a: torch.from_numpy(v.astype(np.float32) if v.dtype == ml_dtypes.bfloat16 else v).to(torch_device)
          for a, v in arrays.items()}
    if spec.dtype == "bfloat16":
        tf = {a: v.to(torch.bfloat16) for a, v in tf.items()}
    sync = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = spec.precision == "tf32"
    fn, back = peer(spec, tf)
    t_peer = torch_seconds(fn, sync, reps)
    theirs = back(fn()).float().cpu().numpy()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    fn64, back64 = peer(spec, {a: v.double() for a, v in tf.items()})
    exact = back64(fn64()).cpu().numpy()
    e_tile, e_peer = max_error(got, exact), max_error(theirs, exact)
    return dict(category=spec.category, case=spec.label, peer=spec.peer, tile_ms=t_tile * 1e3,
                peer_ms=t_peer * 1e3, ratio=t_peer / t_tile, goal=spec.goal,
                tile_tflops=spec.flops / t_tile / 1e12, peer_tflops=spec.flops / t_peer / 1e12,
                tile_err=e_tile, peer_err=e_peer, err_ok=e_tile <= e_peer, kernels=kernels, spec=asdict(spec))


def run(specs: list[Spec], measure_one: Callable[[Spec], dict], budget: float,
        clock: Callable[[], float] = time.monotonic, out=sys.stdout,
        on_row: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Each case measured in turn (a failure becomes its row's ``error``) while the time spent
    plus the slowest case so far stays within ``budget`` seconds; the rest are rows ``skipped``.
    ``on_row`` sees the rows so far after each measured one (the JSON, kept current)."""
    start, slowest, rows = clock(), 0.0, []
    for spec in specs:
        t0 = clock()
        if t0 - start + slowest > budget:
            rows.append(dict(category=spec.category, case=spec.label, peer=spec.peer, skipped="budget",
                             spec=asdict(spec)))
            continue
        try:
            row = measure_one(spec)
        except Exception as e:  # noqa: BLE001 - a failed case is a row of the report, not the end of it
            first = str(e).splitlines()[0] if str(e) else ""
            row = dict(category=spec.category, case=spec.label, peer=spec.peer,
                       error=f"{type(e).__name__}: {first}", spec=asdict(spec))
        slowest = max(slowest, clock() - t0)
        rows.append(row)
        print(table_row(row), file=out, flush=True)
        on_row(rows)
    return rows


HEADER = ("| category | case | Tile ms | PyTorch ms | ratio (goal) | max err Tile / peer | Tile TFLOP/s "
          "| Tile's kernels |\n|---|---|---:|---:|---:|---|---:|---|")


def table_row(r: dict) -> str:
    head = f"| {r['category']} | {r['case']} vs {r['peer']} |"
    if "skipped" in r:
        return f"{head} | | | | | skipped ({r['skipped']}) |"
    if "error" in r:
        return f"{head} | | | | | failed: {r['error']} |"
    mark = "" if r["ratio"] >= r["goal"] else " **low**"
    err = f"{r['tile_err']:.2e} / {r['peer_err']:.2e}" + ("" if r["err_ok"] else " **worse**")
    kernels = ", ".join(r["kernels"])
    return (f"{head} {r['tile_ms']:.3f} | {r['peer_ms']:.3f} | {r['ratio']:.2f} ({r['goal']}){mark} | {err} "
            f"| {r['tile_tflops']:.1f} | {kernels} |")


def table(rows: list[dict]) -> str:
    """The Markdown table, then a line counting the cases that meet both goals."""
    done = [r for r in rows if "ratio" in r]
    met = sum(r["ratio"] >= r["goal"] and r["err_ok"] for r in done)
    tail = f"\n\n{met} of {len(done)} measured cases meet both goals; {len(rows) - len(done)} not measured."
    return "\n".join([HEADER, *(table_row(r) for r in rows)]) + tail


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("device", nargs="?", default="cuda.0")
    ap.add_argument("--quick", action="store_true", help="a subset, about a minute on an H100")
    ap.add_argument("--held-out", action="store_true", help="sizes drawn from --seed, none listed")
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated categories")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; no case starts past it")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--torch-device", default="")
    ap.add_argument("--config", default="", help="Tile's optimizer config (a path or a built-in name)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import torch

    torch.backends.cudnn.benchmark = True
    tdev = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    specs = held_out(args.seed, args.per_category) if args.held_out else quick() if args.quick else listed()
    if args.only:
        specs = [s for s in specs if s.category in args.only.split(",")]
    meta = dict(device=args.device, torch=torch.__version__, torch_device=tdev, seed=args.seed,
                held_out=args.held_out, quick=args.quick, budget=args.budget, config=args.config,
                gpu=torch.cuda.get_device_name() if tdev.startswith("cuda") else "")

    def save(rows: list[dict]) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    print(HEADER, flush=True)
    config = args.config or None
    rows = run(specs, lambda s: measure(s, args.device, tdev, args.reps, args.seed, config), args.budget,
               on_row=save)
    save(rows)
    print("\n" + table(rows))


if __name__ == "__main__":
    main()
