"""Shape-generic kernels (issue 40, ``backends.llvm.generic``): code generations per kernel over many
sequence lengths, and the generic kernels' speed against the specialized ones'. Called by
``python -m bench.new_shapes --only generations,speed``; figures in bench/RESULTS.md ("Compile
time: shape-generic kernels").

On the C-like targets (``backends.clike.generic``): ``python -m bench.generic_shapes --device
opencl_cpu.0`` (or ``opencl_gpu.0``, ``cuda.0``) prints the code generations and program builds per
kernel over ``--lengths`` and the generic kernels' speed against the specialized ones' (figures in
bench/RESULTS.md, "Compile time: generic kernels on OpenCL and CUDA")."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

import tile
from backends.llvm import generic
from bench.compile_time import ATTENTION, MATMUL
from stripe.ir import RefDir


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _attention_inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(n)
    return [rng.integers(-2, 3, size=s).astype(np.float32) for s in [(n, 8), (n, 8), (n, n), (n, 8)]]


def _attention_reference(q, k, r, v) -> np.ndarray:
    m = q.astype(np.float64) @ k.T.astype(np.float64) + r
    p = np.exp(m - m.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def kernel_of(info) -> str:
    """A kernel across lengths: its kind (its name without sizes) and the buffers it writes (at
    S = 1 the attention is another program: ``L = Q K^T`` and ``M = L + R`` apart, ``P V`` an
    elementwise product; those kernels count apart from ``matmul->M``, the fused ``Q K^T + R``)."""
    writes = sorted({r.source for r in info.block.refs if r.dir in (RefDir.OUT, RefDir.INOUT)})
    return re.sub(r"_[0-9x_t]+$", "", info.name) + "->" + ",".join(writes)


def generated_kernels(lib) -> list:
    """The kernels of library ``lib`` whose code its build generated (specialized or generic; with
    the object cache off every specialized build generates)."""
    which, built = lib.extra.get("generic", {}).get("which", {}), lib.extra["built_as"]
    return [info for j, info in enumerate(lib.kernels) if built[j] == j and which.get(j, True)]


def generations(lengths: list[int]) -> str:
    """The attention forward at every length, specialized (``{}``) then generic: per kernel
    (``kernel_of``), how many lengths generated code for it (and which, for the generic mode);
    every result checked against float64 numpy."""
    lines = [f"generations: attention forward at {len(lengths)} lengths {lengths[0]}..{lengths[-1]}, "
             f"one process each mode, object cache off; load average {_load()}"]
    loops = {"generic": True, "generic_products": True, "tiled": False}  # products as plain loops
    for mode, settings in (("specialized", {}), ("generic", {"generic": True}), ("loops", loops)):
        generic.REGISTRY.clear()
        exe = tile.compile(ATTENTION, "llvm_cpu.0", {**settings, "cache": False})
        gens: dict[str, list[int]] = {}
        seen: dict[str, int] = {}
        start, cpu = time.perf_counter(), time.process_time()
        for n in lengths:
            args = _attention_inputs(n)
            out = exe(*args)["O"]
            want = _attention_reference(*args)
            tol = 8 * (n + 8) * np.finfo(np.float32).eps * max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(out, want, rtol=0, atol=tol, err_msg=f"{mode} at {n}")
            lib = exe._last.library
            for j, info in enumerate(lib.kernels):
                if lib.extra["built_as"][j] == j:
                    seen[kernel_of(info)] = seen.get(kernel_of(info), 0) + 1
            for info in generated_kernels(lib):
                gens.setdefault(kernel_of(info), []).append(n)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        row = ", ".join(f"{k} {len(gens[k])}/{seen[k]}" for k in sorted(gens))
        lines.append(f"  {mode:<12} {wall:7.1f} s ({cpu:.1f} s CPU): code generations/lengths per kernel: "
                     + row)
        if mode == "generic":
            lines.extend(f"    {k}: at {', '.join(map(str, v))}" for k, v in sorted(gens.items()))
    return "\n".join(lines)


CHAIN = "function (A[N, D], B[N, D]) -> (C) { C = exp(A) * B + A * A; }"
ROWS = "function (A[N, D]) -> (S) { S[i: N] = +(A[i, d] * A[i, d]); }"
SOFTMAX = "function (X[N, D]) -> (P) { P = builtin_softmax(X, N, D); }"


def attention_speed(repeat: int, lengths=(64, 128, 256, 512)) -> str:
    """The attention forward, every kernel generic (the ``generic`` setting: its products as
    generic micro-kernels, ``generic_tiles``; its buckets built at two other lengths first) against
    the default specialized build."""
    lines = [f"attention speed: best of {repeat} calls, interleaved; load average {_load()}",
             f"{'S':>6}{'specialized us':>16}{'generic us':>12}{'ratio':>8}{'generic kernels':>17}"]
    for n in lengths:
        generic.REGISTRY.clear()
        spec = tile.compile(ATTENTION, "llvm_cpu.0", {"cache": False})
        gen = tile.compile(ATTENTION, "llvm_cpu.0", {"generic": True, "cache": False})
        for m in (n + 3, n + 5):
            gen(*_attention_inputs(m))
        ins = _attention_inputs(n)
        a, b = spec(*ins)["O"], gen(*ins)["O"]
        tol = 8 * (n + 8) * np.finfo(np.float32).eps * max(1.0, float(np.abs(a).max()))
        np.testing.assert_allclose(b, a, rtol=0, atol=tol)
        info = gen._last.library.extra["generic"]
        s, g = _interleaved(spec, gen, ins, repeat)
        lines.append(f"{n:>6}{s * 1e6:>16.1f}{g * 1e6:>12.1f}{s / g:>8.2f}"
                     f"{info['kernels']:>12}/{len(gen._last.library.kernels)}")
    return "\n".join(lines)


def _interleaved(spec, gen, ins, repeat: int) -> tuple[float, float]:
    """The best of ``repeat`` calls of the specialized and the generic program on ``ins``, the two
    called in turn (so both meet the same load), in seconds."""
    best = {"s": float("inf"), "g": float("inf")}
    for _ in range(repeat):
        for key, exe in (("s", spec), ("g", gen)):
            t = time.perf_counter()
            exe(*ins)
            best[key] = min(best[key], time.perf_counter() - t)
    return best["s"], best["g"]


def product_speed(repeat: int, sizes=(64, 100, 256, 257, 512)) -> str:
    """``n x n x n`` float32 matmuls, generic (``generic_tiles``: its bucket built at two other
    sizes first) against specialized, interleaved call by call; outputs compared first (within
    the §8.3 bound of a sum of ``n`` products)."""
    lines = [f"products: best of interleaved calls (at least {repeat // 4}); load average {_load()}",
             f"{'n^3':>6}{'specialized us':>16}{'generic us':>12}{'ratio':>8}  generic kernels"]
    for n in sizes:
        generic.REGISTRY.clear()
        rng = np.random.default_rng(n)
        ins = [rng.standard_normal((n, n)).astype(np.float32) for _ in range(2)]
        spec = tile.compile(MATMUL, "llvm_cpu.0", {"cache": False})
        gen = tile.compile(MATMUL, "llvm_cpu.0", {"generic": True, "cache": False})
        for m in (n + 3, n + 5):
            gen(*[rng.standard_normal((m, m)).astype(np.float32) for _ in ins])
        a, b = spec(*ins)["C"], gen(*ins)["C"]
        bound = 2 * n * np.finfo(np.float32).eps * (np.abs(ins[0]) @ np.abs(ins[1]))
        assert np.all(np.abs(a - b) <= bound), f"matmul {n}: generic and specialized differ past the bound"
        info = gen._last.library.extra["generic"]
        s, g = _interleaved(spec, gen, ins, max(repeat // 4, int(4e9 / n**3)))
        lines.append(f"{n:>6}{s * 1e6:>16.1f}{g * 1e6:>12.1f}{s / g:>8.2f}  "
                     f"{info['kernels']}/{len(gen._last.library.kernels)}")
    return "\n".join(lines)


def speed(
    repeat: int, shapes=((100, 64), (1000, 64), (4096, 256)), only=("chain", "row sum", "softmax")
) -> str:
    """Best-of-``repeat`` call time of each program (``only``: those named), generic (its bucket built
    at two other lengths first) against specialized, interleaved call by call; outputs compared first."""
    lines = [f"speed: best of {repeat} calls, interleaved; load average {_load()}",
             f"{'program':<10}{'shape':>12}{'specialized us':>16}{'generic us':>12}{'ratio':>8}"]
    for name, src in (("chain", CHAIN), ("row sum", ROWS), ("softmax", SOFTMAX)):
        if name not in only:
            continue
        for n, d in shapes:
            generic.REGISTRY.clear()
            rng = np.random.default_rng(n)
            ins = [rng.standard_normal((n, d)).astype(np.float32) for _ in range(src.count("[N, D]"))]
            spec = tile.compile(src, "llvm_cpu.0", {"cache": False})
            gen = tile.compile(src, "llvm_cpu.0", {"generic": True, "cache": False})
            for m in (n + 3, n + 5):  # the bucket's first kernel, then its template
                gen(*[rng.standard_normal((m, d)).astype(np.float32) for _ in ins])
            a, b = spec(*ins), gen(*ins)
            assert gen._last.library.extra["generic"]["kernels"] >= 1, f"{name}: not generic"
            for k in a:
                tol = 8 * d * np.finfo(np.float32).eps * max(1.0, float(np.abs(a[k]).max()))
                np.testing.assert_allclose(b[k], a[k], rtol=0, atol=tol)
            s, g = _interleaved(spec, gen, ins, repeat)
            lines.append(f"{name:<10}{f'{n}x{d}':>12}{s * 1e6:>16.1f}{g * 1e6:>12.1f}{s / g:>8.2f}")
    return "\n".join(lines)


ROW_SOFTMAX = ("function (A[N, D]) -> (B) { R[n, 0: N, 1] = >(A[n, m]); E = exp(A - R); "
               "S[n, 0: N, 1] = +(E[n, m]); B = E / S; }")  # a row program (``row_fusion``) from N = 9
CLIKE_PROGRAMS = (("chain", CHAIN), ("row sum", ROWS), ("softmax", SOFTMAX), ("rows", ROW_SOFTMAX),
                  ("attention", ATTENTION))


def _clike_inputs(name: str, src: str, n: int, d: int) -> list[np.ndarray]:
    if name == "attention":
        return _attention_inputs(n)
    rng = np.random.default_rng(n * 7919 + d)
    return [rng.integers(-2, 3, size=(n, d)).astype(np.float32) for _ in range(src.count("[N, D]"))]


def _registry(device: str):
    from backends import registry

    return registry.get(device).compiler.generic  # (``backends.clike.generic.Registry``)


def clike_generations(device: str, lengths: list[int], d: int = 64) -> str:
    """Each program of ``CLIKE_PROGRAMS`` at every length ``N`` (``D = d``; the attention's S = N),
    specialized then generic, disk cache off: per kernel (``kernel_of``), at how many lengths its
    source was generated (a generic kernel's only when its template was), and the OpenCL programs
    compiled (``opencl_*``); every result checked against the interpreter (integer-valued inputs).
    PoCL keeps compiled kernels in a cache of its own, so a second run's programs compile faster:
    ``POCL_KERNEL_CACHE=0`` for cold figures."""
    lines = [f"generations on {device}: {len(lengths)} lengths {lengths[0]}..{lengths[-1]} (D = {d}), one "
             f"process, cache off; load average {_load()}"]
    compiled = None
    if device.startswith("opencl"):
        from backends.opencl.compiler import COMPILED as compiled
    for name, src in CLIKE_PROGRAMS:
        ref = tile.compile(src, "interp")
        for mode, settings in (("specialized", {}), ("generic", {"generic": True})):
            _registry(device).clear()
            exe = tile.compile(src, device, {**settings, "cache": False})
            gens: dict[str, int] = {}
            seen: dict[str, int] = {}
            programs = compiled[0] if compiled else 0
            start, cpu = time.perf_counter(), time.process_time()
            for n in lengths:
                ins = _clike_inputs(name, src, n, d)
                got, want = exe(*ins), ref(*ins)
                for k in want:
                    tol = 8 * (n + d) * np.finfo(np.float32).eps * max(1.0, float(np.abs(want[k]).max()))
                    np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=f"{name} {n}")
                lib = exe._last.library
                uses = lib.extra.get("generic", {}).get("uses", {})
                for j, info in enumerate(lib.kernels):
                    kind = kernel_of(info)
                    seen[kind] = seen.get(kind, 0) + 1
                    if j not in uses or uses[j].built:
                        gens[kind] = gens.get(kind, 0) + 1
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            built = f", {compiled[0] - programs} programs compiled" if compiled else ""
            row = ", ".join(f"{k} {gens.get(k, 0)}/{seen[k]}" for k in sorted(seen))
            lines.append(f"  {name:<10}{mode:<12}{wall:7.1f} s ({cpu:.1f} s CPU){built}: generations/lengths "
                         f"per kernel: {row}")
    return "\n".join(lines)


def clike_speed(device: str, repeat: int, shapes=((1000, 64), (4096, 256), (16384, 256))) -> str:
    """Best-of-``repeat`` call time of the chain, the row sum and the softmaxes on ``device``, generic
    (its bucket built at two other lengths first) against specialized, interleaved call by call,
    and the best of ``repeat // 5`` kernel times as the device profiles them (``Executable.profile``:
    no launch, copy or host overhead); outputs compared first (a generic kernel computes what the
    specialized one does, bit for bit)."""
    lines = [f"speed on {device}: calls: best of {repeat}, interleaved; kernels: best of "
             f"{max(1, repeat // 5)} profiled runs; load average {_load()}",
             f"{'program':<10}{'shape':>12}{'call spec us':>14}{'generic us':>12}{'ratio':>7}"
             f"{'kernel spec us':>16}{'generic us':>12}{'ratio':>7}"]
    for name, src in CLIKE_PROGRAMS[:4]:
        for n, d in shapes:
            _registry(device).clear()
            spec = tile.compile(src, device, {"cache": False})
            gen = tile.compile(src, device, {"generic": True, "cache": False})
            for m in (n + 3, n + 5):  # the bucket's first kernel, then its template
                gen(*_clike_inputs(name, src, m, d))
            ins = _clike_inputs(name, src, n, d)
            a, b = spec(*ins), gen(*ins)
            lib = gen._last.library
            assert lib.extra["generic"]["kernels"] == len(lib.kernels), f"{name}: not generic"
            for k in a:
                np.testing.assert_array_equal(b[k], a[k], err_msg=f"{name} {n}x{d}")
            s, g = _interleaved(spec, gen, ins, repeat)
            ks, kg = _kernel_times(spec, gen, ins, max(1, repeat // 5))
            lines.append(f"{name:<10}{f'{n}x{d}':>12}{s * 1e6:>14.1f}{g * 1e6:>12.1f}{s / g:>7.2f}"
                         f"{ks * 1e6:>16.1f}{kg * 1e6:>12.1f}{ks / kg:>7.2f}")
    return "\n".join(lines)


def _kernel_times(spec, gen, ins, repeat: int) -> tuple[float, float]:
    """The best of ``repeat`` device-profiled runs of each program's kernels (seconds, summed over
    its kernels), the two in turn."""
    best = {"s": float("inf"), "g": float("inf")}
    for _ in range(repeat):
        for key, exe in (("s", spec), ("g", gen)):
            exe(*ins)
            best[key] = min(best[key], sum(t for _, t in exe.profile()))
    return best["s"], best["g"]


def gen_lengths(spec: str) -> list[int]:
    """Comma-separated parts: ``a:b:s`` (a step) or ``a:b:*f`` (a geometric walk by factor f)."""
    out: list[int] = []
    for part in spec.split(","):
        a, b, s = part.split(":")
        if s.startswith("*"):
            x = float(a)
            while x <= int(b):
                out.append(int(x))
                x *= float(s[1:])
            out.append(int(b))
        else:
            out.extend(range(int(a), int(b) + 1, int(s)))
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.generic_shapes", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="opencl_cpu.0", help="opencl_cpu.0, opencl_gpu.0 or cuda.0")
    p.add_argument("--lengths", default="1:32:1,48:1024:*1.5", help="generations: a:b:step, a:b:*factor, ...")
    p.add_argument("--only", default="generations,speed", help="generations, speed")
    p.add_argument("--repeat", type=int, default=50, help="speed: calls timed per program and mode")
    args = p.parse_args(argv)
    if "generations" in args.only:
        print(clike_generations(args.device, gen_lengths(args.lengths)), flush=True)
    if "speed" in args.only:
        print(clike_speed(args.device, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
