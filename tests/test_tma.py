"""GEMM kernels fed by the tensor memory accelerator (``backends.cuda.tma``), checked without a GPU:
which GEMMs ``gemm_tile`` plans on the launched tiles (``backends.cuda.launched.ranking``,
``stripe.gemm.streams``), the generated kernel (one loading warp, ``mbarrier`` hand-over, bulk
tensor copies, the tensor-map arguments) and its launch record, the PTX declaration of its dynamic
local memory (``backends.cuda.ptx``), and the host side of launching through CUDA that runs without one
(``backends.cuda.launch``: who may launch, slab pieces of shared blocks, the order of CUDA
and OpenCL work). Running the kernels needs an H100 (compute capability 9.0, CUDA's driver and
memory shared with OpenCL, and ``TILE_CUDA_LAUNCH`` not ``0``): tests/test_tma_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import re
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pyopencl as cl
import pytest

from backends import registry
from backends.clike import generate
from backends.cuda import launched, tile_store, tma
from backends.cuda.launch import PLAIN, CudaKernel, Launcher, LaunchingExecutor, Slabs
from backends.cuda.ptx import declare_dynamic, for_sm90a
from backends.cuda.share import EXTENSIONS, SharedCLBuffer
from backends.cuda.wgmma import SM90A
from backends.driver import config_for, kernels
from backends.opencl.driver import Driver
from backends.opencl.executor import CLBuffer
from backends.opencl.target import OpenCLTarget
from stripe.gemm import streams
from stripe.ir import walk
from stripe.passes import optimize
from stripe.passes.gemm_tile import GemmTileConfig, analyze
from tests.pass_support import lowered
from tests.test_tensorize import BMM, MLP, MM, PADDED_CONV, UNIT, VALID_CONV, fake_device, plans
from tile.errors import TileDeviceError

WG = UNIT.warpgroup
LAUNCH = launched.of(UNIT)  # the launched kernel's facts (backends.cuda.launched)
H100_LAUNCH = 227 * 1024  # the dynamic local memory an H100 launches kernels with
H100_THREADS = 1024  # its work-group limit (the config's default, 256, is below a 256 x 128 tile's)
SHAPES = {"A": (1024, 2048), "B": (2048, 512)}  # M, K, N all different and dividing the tiles
MM_SWAPPED = "function (B[K, N], A[M, K]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MM_AT = "function (A[K, M], B[K, N]) -> (C) { C[m, n : M, N] = +(A[k, m] * B[k, n]); }"


def hopper(launch_bytes: int, threads: int = H100_THREADS) -> SimpleNamespace:
    """An H100 as ``config_for`` sees it: the unit as ``OpenCLDevice.unit_here`` gives it to a device
    that launches through CUDA with ``launch_bytes`` (0: OpenCL only), work-groups of ``threads``."""
    dev = fake_device("NVIDIA Corporation", "cl_nv_device_attribute_query", (9, 0), launch_bytes)

    def hardware(hw):
        units = {k: dev.unit_here(u) for k, u in hw.matrix_units.items()}
        execs = {k: replace(u, threads=threads) for k, u in hw.exec_units.items()}
        return replace(hw, matrix_units=units, exec_units=execs)

    return SimpleNamespace(optimizer="opencl_gpu", hardware=hardware)


def optimized(src: str, shapes: dict, dtype=np.float16, launch_bytes: int = H100_LAUNCH,
              precision: str | None = None, threads: int = H100_THREADS):
    """The program optimized for ``hopper(launch_bytes, threads)``, and the config it used."""
    cfg = config_for(hopper(launch_bytes, threads), {"precision": precision} if precision else {})
    return optimize(lowered(src, shapes, np.dtype(dtype)), cfg), cfg


def generated(program, cfg, launch_bytes: int = H100_LAUNCH, compute_units: int = 0) -> list:
    """The program's ``KernelSource``s for an OpenCL target launching with ``launch_bytes``, on
    ``compute_units`` (0: unknown)."""
    t = OpenCLTarget(fp64=True, fp16=True, exact_div=True, fast_math=False, half_extension=True,
                     contract=True)
    t.workgroups = True
    t.matrix_units = dict(cfg.hardware.matrix_units)
    t.launch_bytes = launch_bytes
    t.compute_units = compute_units
    return generate(t, kernels(program), {})


def launched_kernel(src: str = MM, shapes: dict = SHAPES, dtype=np.float16, launch_bytes: int = H100_LAUNCH):
    """The plan and the one kernel of a GEMM that takes the launched tiles."""
    p, cfg = optimized(src, shapes, dtype)
    (plan,) = plans(p)
    (k,) = generated(p, cfg, launch_bytes)
    assert k.launch is not None, "expected the launched kernel"
    return plan, k


def signature(text: str) -> tuple[int, list[str]]:
    """The kernel's required work-group size and its parameters' names."""
    m = re.search(r"reqd_work_group_size\((\d+), 1, 1\)\)\)\s*void \w+\(([^)]*)\)", text)
    assert m is not None, text[:300]
    return int(m[1]), [p.split()[-1] for p in m[2].split(",")]


def stage_bytes(plan) -> int:
    """One K step's tiles of A and B (16-bit elements)."""
    return (plan.tm + plan.tn) * plan.kt * 2


# ------------------------------------------------------------------------------ planning
@pytest.mark.parametrize("dtype,mode", [(np.float16, "f16"), (ml_dtypes.bfloat16, "bf16")])
def test_streaming_16_bit_matmuls_take_the_launched_tiles(dtype, mode):
    p, cfg = optimized(MM, SHAPES, dtype)
    assert launched.of(cfg.hardware.matrix_units["tensor_core"]).local_KiB == H100_LAUNCH / 1024
    (plan,) = plans(p)
    assert plan.unit == f"tensor_core.{mode}"
    assert (plan.tm, plan.tn) in LAUNCH.tiles and plan.kt * 2 == LAUNCH.k_bytes
    assert plan.rm == 16 and plan.rn == plan.tn  # one multiplying warp per 16 rows


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("threads", [H100_THREADS, 256])
def test_without_launching_the_warp_group_tiles_stay(dtype, threads):
    (plan,) = plans(optimized(MM, SHAPES, dtype, launch_bytes=0, threads=threads)[0])
    assert (plan.tm, plan.tn) in WG.tiles and plan.kt * 2 == WG.k_bytes


@pytest.mark.parametrize("src,shapes,dtype,precision", [
    (MM, {"A": (1000, 1000), "B": (1000, 1000)}, np.float16, None),  # 32 overhanging tiles, 132 units
    (BMM, {"A": (4, 512, 256), "B": (4, 256, 512)}, np.float16, None),
    (VALID_CONV, {"I": (8, 58, 58, 64), "F": (3, 3, 64, 128)}, np.float16, None),
    (PADDED_CONV, {"I": (8, 56, 56, 64), "F": (3, 3, 64, 128)}, np.float16, None),
], ids=["1000^3", "batched", "valid-conv", "padded-conv"])  # (32-bit: tests/test_kmajor.py; 16-bit
# overhanging tiles that fill the units stream: tests/test_cuda_ragged.py)
def test_gemms_that_do_not_stream_keep_the_opencl_tiles(src, shapes, dtype, precision):
    """The same plan as on a device that launches through OpenCL only, and no launched kernel."""
    p, cfg = optimized(src, shapes, dtype, precision=precision)
    (plan,) = plans(p)
    assert (plan.tm, plan.tn) not in LAUNCH.tiles or plan.kt * 2 != LAUNCH.k_bytes
    assert plans(optimized(src, shapes, dtype, launch_bytes=0, precision=precision)[0]) == [plan]
    assert all(k.launch is None for k in generated(p, cfg))


def gemm_of(src: str, shapes: dict):
    """The ``Gemm`` ``gemm_tile`` reads from the lowered program's one contraction."""
    program = lowered(src, shapes, np.float16)
    main = next(b for b in walk(program) if "main" in b.tags)
    (kb,) = [b for b in main.stmts if "contraction" in b.tags]
    g = analyze(kb, main, GemmTileConfig(reqs=("contraction",)), halves=True)
    assert g is not None
    return g


@pytest.mark.parametrize("src,shapes,tiles,want", [
    (MM, {"A": (64, 304), "B": (304, 128)}, (64, 64, 16), True),
    (MM, {"A": (64, 304), "B": (304, 128)}, (64, 128, 16), True),
    (MM, {"A": (64, 300), "B": (300, 128)}, (64, 64, 4), False),  # A's rows: 600 bytes apart
    (MM, {"A": (64, 304), "B": (304, 128)}, (128, 64, 16), False),  # M = 64 < tm
    (MM, {"A": (64, 304), "B": (304, 128)}, (64, 64, 32), False),  # 304 = 9.5 steps of 32
    (MM_AT, {"A": (304, 64), "B": (304, 128)}, (64, 64, 16), False),  # A's rows along M
    (BMM, {"A": (2, 64, 304), "B": (2, 304, 128)}, (64, 64, 16), False),
    (VALID_CONV, {"I": (2, 18, 18, 64), "F": (3, 3, 64, 64)}, (64, 64, 16), False),
])
def test_streams(src, shapes, tiles, want):
    assert streams(gemm_of(src, shapes), *tiles, 2) is want


def test_the_launched_kernel_fits_the_modelled_work_group():
    """The loading warp counts: with work-groups of 256, a 128 x 256 tile (8 + 1 warps) is not
    planned."""
    p, cfg = optimized(MM, SHAPES, threads=256)
    assert all(k.local <= 256 for k in generated(p, cfg))


# ------------------------------------------------------------------------------ the kernel
def test_one_warp_loads_and_the_others_multiply():
    plan, k = launched_kernel()
    text, warps = k.text, plan.tm // 16
    assert text.count(f"if (warp == {warps}) {{") == 1
    loader = text[text.index(f"if (warp == {warps})"):text.index("} else {")]
    copies = [ln for ln in loader.splitlines() if "cp.async.bulk.tensor.2d" in ln]
    assert sum("tmap_a" in ln for ln in copies) == 1 and sum("tmap_b" in ln for ln in copies) == plan.tn // 64
    announced = re.findall(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%0\], (\d+);", loader)
    assert announced == [str(stage_bytes(plan))]
    # per stage a full barrier (the loader's one arrival) and an empty one (each multiplying warp)
    inits = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%0\], (\d+);", text)
    assert Counter(inits) == {"1": tma.STAGES, str(warps): tma.STAGES}
    assert text.count("barrier(") == 1 and text.index("barrier(") < text.index(f"if (warp == {warps})")


def test_the_multiplying_warps_leave_one_step_of_products_running():
    plan, k = launched_kernel()
    consumer = k.text[k.text.index("} else {"):]
    end = consumer.index("wgmma.wait_group.sync.aligned 0;")  # all products done, after the loop
    loop = consumer[consumer.index("for (int ks = 0;"):end]
    assert "wgmma.wait_group.sync.aligned 1;" in loop and "mbarrier.try_wait.parity" in loop
    assert "barrier(" not in loop and "wgmma.wait_group.sync.aligned 1;" not in consumer[end:]
    assert loop.rindex("}") > loop.rindex("mbarrier.arrive.shared::cta.b64")  # released in the loop
    assert f"const uint buf = it % {tma.STAGES};" in loop  # (``it``: K steps over the tiles so far)
    assert re.search(rf"for \(int ks = 0; ks < {SHAPES['A'][1] // plan.kt}; ks\+\+, it\+\+\)", loop)


def tile_origins(text: str, tile: int) -> tuple[int, int]:
    """The loop's ``m0``/``n0`` for tile number ``tile``, from the kernel's own lines."""
    at = text.index("for (int tile = grp;")
    lines = text[at:].splitlines()[1:5]
    env = {"tile": tile, "min": min}
    for line in lines:
        name, expr = line.strip().removeprefix("const int ").rstrip(";").split(" = ")
        env[name] = eval(expr.replace("(int)", "").replace("/", "//"), env)  # (non-negative: C's /)
    return env["m0_m"], env["n0_n"]


@pytest.mark.parametrize("units", [0, 132, 7])
def test_each_work_group_loops_over_its_tiles_and_each_tile_is_taken_once(units):
    """With the compute units known, one work-group each (``PERSISTENT``), every ``units``-th tile
    from its own; tiles numbered down bands of ``BAND`` tile rows."""
    shapes = {"A": (4096, 256), "B": (256, 1024)}
    p, cfg = optimized(MM, shapes, np.float16)
    (plan,) = plans(p)
    (k,) = generated(p, cfg, compute_units=units)
    ntm, ntn = 4096 // plan.tm, 1024 // plan.tn
    launched = min(units, ntm * ntn) if units else ntm * ntn
    assert k.work_items == launched * k.local
    assert k.text.count(f"tile < {ntm * ntn}; tile += {launched})") == 2  # the loader and the multipliers
    origins = [tile_origins(k.text, t) for t in range(ntm * ntn)]
    want = {(m * plan.tm, n * plan.tn) for m in range(ntm) for n in range(ntn)}
    assert len(set(origins)) == len(origins) and set(origins) == want
    band = min(tma.BAND, ntm)
    assert {m for m, _ in origins[: band * ntn]} == {m * plan.tm for m in range(band)}  # the first band


def test_a_tiles_last_step_is_released_for_the_next_tiles_copies():
    plan, k = launched_kernel()
    consumer = k.text[k.text.index("} else {"):]
    after = consumer[consumer.index("wgmma.wait_group.sync.aligned 0;"):]
    release = "mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"(Mb_at + 8 * (4 + (it - 1) % 4))"
    assert release in after[: after.index("Ws_at")]  # before the store, once per tile


def test_the_signature_and_the_marked_instructions():
    plan, k = launched_kernel()
    local, params = signature(k.text)
    assert local == k.local == (plan.tm // 16 + 1) * 32
    assert params[-2:] == list(tma.MAPS) == ["tmap_a", "tmap_b"]
    (m, _), (_, n) = SHAPES["A"], SHAPES["B"]
    assert k.work_items == (m // plan.tm) * (n // plan.tn) * local
    assert f"mov.u32 %0, {tma.DYNAMIC};" in k.text
    for line in k.text.splitlines():  # OpenCL C compiles for sm_90: every PTX instruction is marked
        if "asm" in line:
            assert SM90A in line, line


# ------------------------------------------------------------------------------ the launch record
@pytest.mark.parametrize("src,shapes,a,b", [
    (MM, SHAPES, "A", "B"),
    (MM_SWAPPED, SHAPES, "A", "B"),  # B is the first parameter
    (MLP, {"X": (1024, 512), "W": (512, 768), "Bias": (768,)}, "X", "W"),  # bias + relu fused
])
def test_the_launch_record_maps_the_operands(src, shapes, a, b):
    plan, k = launched_kernel(src, shapes)
    _, params = signature(k.text)
    (m, kk), (_, n) = shapes[a], shapes[b]
    maps = k.launch["maps"]
    assert [params[i].split("_", 1)[1] for i, *_ in maps] == [a, b]
    assert [tuple(rest) for _, *rest in maps] == [
        ((kk, m), kk * 2, (plan.kt, plan.tm), "float16"),  # K innermost, a box of tm rows
        ((n, kk), n * 2, (64, plan.kt), "float16"),  # N innermost, 64 columns (128 bytes) a box
    ]
    staging = tile_store.WARP_BYTES * plan.tm // 16  # each multiplying warp's output rows
    assert fitting(plan, H100_LAUNCH - staging) >= tma.STAGES  # all of them
    assert k.launch["local_bytes"] == tma.STAGES * (stage_bytes(plan) + 16) + staging


def fitting(plan, launch_bytes: int) -> int:
    """How many K steps (tiles and two 8-byte barriers each) fit ``launch_bytes``."""
    return launch_bytes // (stage_bytes(plan) + 16)


@pytest.mark.parametrize("launch_bytes", [H100_LAUNCH, 160 * 1024, 110 * 1024])
def test_the_kernel_keeps_the_stages_that_fit(launch_bytes):
    """A device launching with less local memory keeps fewer K steps in flight (at most ``STAGES``)."""
    plan, k = launched_kernel(launch_bytes=launch_bytes)
    stages = min(tma.STAGES, fitting(plan, launch_bytes))
    staging = tile_store.WARP_BYTES * plan.tm // 16  # the output's rows, where no K step is lost
    if fitting(plan, launch_bytes - staging) < stages:
        staging = 0
    assert ("Ws_at" in k.text) == (staging > 0)
    assert k.launch["local_bytes"] == stages * (stage_bytes(plan) + 16) + staging <= launch_bytes
    assert f"const uint buf = it % {stages};" in k.text
    assert k.text.count("mbarrier.init") == 2 * stages


@pytest.mark.parametrize("launch_bytes", [0, H100_LAUNCH])
def test_a_plain_plan_gets_the_opencl_kernel(launch_bytes):
    """Tiles planned for OpenCL's local memory (``Launch.local_KiB`` 0) are not the launched kernel's,
    whatever the target launches with: ``schedule.tma_fits`` refuses, the warp-group kernel stays."""
    p, cfg = optimized(MM, SHAPES, launch_bytes=0)
    (k,) = generated(p, cfg, launch_bytes)
    assert k.launch is None and "wgmma.mma_async" in k.text
    assert "cp.async.bulk.tensor" not in k.text and tma.DYNAMIC not in k.text and "mbarrier" not in k.text


# ------------------------------------------------------------------------------ PTX
PTX = b""".version 8.0
.target sm_90
.address_size 64

.visible .entry k()
{
\t//sm_90a wgmma.fence.sync.aligned;
\tret;
}
"""
DYNAMIC_PTX = PTX.replace(b"\tret;", f"\t{SM90A}mov.u32 %r1, {tma.DYNAMIC};\n\tret;".encode())


def test_the_dynamic_local_memory_is_declared_after_the_header():
    lines = for_sm90a(DYNAMIC_PTX).decode().splitlines()
    at = lines.index(".address_size 64")
    assert lines[at + 1] == f".extern .shared .align 1024 .b8 {tma.DYNAMIC}[];"
    assert f"\tmov.u32 %r1, {tma.DYNAMIC};" in lines and ".target sm_90a" in lines


def test_without_the_name_nothing_is_declared():
    assert b".extern .shared" not in for_sm90a(PTX)


def test_a_ptx_without_address_size_is_refused():
    with pytest.raises(ValueError, match="no .address_size"):
        declare_dynamic(DYNAMIC_PTX.replace(b".address_size 64\n", b""))


# ------------------------------------------------------------------------------ launching
@pytest.fixture
def fresh_launchers(monkeypatch):
    """``Launcher.for_device`` probing anew (its answers are cached per device)."""
    monkeypatch.setattr(Launcher, "_found", {})
    monkeypatch.delenv("TILE_CUDA_LAUNCH", raising=False)  # (on unless it is 0)
    return monkeypatch


@pytest.fixture(scope="module")
def pocl():
    try:
        dev = registry.get("opencl_cpu.0")
    except TileDeviceError as e:
        pytest.skip(f"no PoCL CPU device opencl_cpu.0 to hold OpenCL buffers: {e}")
    if not isinstance(dev, Driver):
        pytest.skip(f"opencl_cpu.0 is not an OpenCL device ({dev!r})")
    return dev


def test_only_an_opencl_device_may_launch(fresh_launchers):
    launcher, why = Launcher.for_device(SimpleNamespace(id="fake.0"))
    assert launcher is None and why == "fake.0 is not an OpenCL device"


def test_tile_cuda_launch_0_turns_launching_off(fresh_launchers, pocl):
    fresh_launchers.setenv("TILE_CUDA_LAUNCH", "0")
    launcher, why = Launcher.for_device(pocl)
    assert launcher is None and why == "turned off by TILE_CUDA_LAUNCH=0"
    assert not Launcher._found  # the refusal is not cached: unsetting it probes the device


@pytest.mark.parametrize("value", [None, "1", "yes"])
def test_launching_is_on_unless_the_environment_says_0(fresh_launchers, pocl, value):
    """Any other value (or none) lets the device be probed: PoCL then fails for want of CUDA."""
    if value is not None:
        fresh_launchers.setenv("TILE_CUDA_LAUNCH", value)
    launcher, why = Launcher.for_device(pocl)
    assert launcher is None and why.startswith("no memory shared with CUDA (")
    assert pocl.cl_device.int_ptr in Launcher._found  # (the probe's answer is kept)


def test_a_cpu_device_cannot_launch_and_allocates_plain_buffers(fresh_launchers, pocl):
    launcher, why = Launcher.for_device(pocl)
    assert launcher is None and why.startswith("no memory shared with CUDA (")
    assert all(e in why for e in EXTENSIONS if e not in pocl.extensions)
    assert pocl.launch_bytes() == 0
    assert isinstance(pocl.executor, LaunchingExecutor)
    buf = pocl.executor.allocate(1000)
    assert type(buf) is CLBuffer and buf.size == 1000


def test_a_launch_record_without_a_launcher_is_refused(fresh_launchers, pocl):
    library = SimpleNamespace(extra={"launch": [{"local_bytes": 1024, "maps": []}], "names": ["tile_k0"]})
    with pytest.raises(RuntimeError, match="cannot launch kernel tile_k0 through CUDA: no memory shared"):
        pocl.executor.prepare(library, 0)


class FakeSharing:
    """Blocks of whole 2 MiB granules, each a real OpenCL buffer with a made-up CUDA address."""

    GRANULE = 2 << 20

    def __init__(self, device: Driver):
        self.device, self.blocks = device, []

    def allocate(self, n: int) -> SimpleNamespace:
        size = -(-n // self.GRANULE) * self.GRANULE
        buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
        block = SimpleNamespace(size=size, cuda_pointer=0x10000000 * (len(self.blocks) + 1),
                                buffer=SimpleNamespace(buf=buf))
        self.blocks.append(block)
        return block


def slabs(device: Driver) -> tuple[Slabs, FakeSharing]:
    sharing = FakeSharing(device)
    return Slabs(sharing, max(16, int(device.cl_device.mem_base_addr_align) // 8)), sharing


def placed(sharing: FakeSharing, buf: SharedCLBuffer) -> tuple[int, int]:
    """The block (its number) and offset of a piece, from its CUDA address; checked against the
    OpenCL sub-buffer's."""
    (n,) = [n for n, b in enumerate(sharing.blocks) if 0 <= buf.cuda_pointer - b.cuda_pointer < b.size]
    at = buf.cuda_pointer - sharing.blocks[n].cuda_pointer
    assert buf.buf.get_info(cl.mem_info.OFFSET) == at
    assert buf.buf.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) == sharing.blocks[n].buffer.buf
    return n, at


@pytest.mark.parametrize("size", [100, 3000, 300 * 1024])
def test_slab_pieces_of_a_class_are_distinct_aligned_pieces_of_a_block(pocl, size):
    s, sharing = slabs(pocl)
    kind = max(s.align, 1 << (size - 1).bit_length())
    count = min(8, sharing.GRANULE // kind + 1)  # 300 KiB: a sixth piece needs a second block
    bufs = [s.allocate(pocl, size) for _ in range(count)]
    spots = [placed(sharing, b) for b in bufs]
    assert len(set(spots)) == count and all(b.size == size for b in bufs)
    assert all(at % kind == 0 and at + kind <= sharing.blocks[n].size for n, at in spots)
    assert len(sharing.blocks) == -(-count // (sharing.GRANULE // kind))


def test_a_freed_piece_serves_the_next_buffer_of_its_class(pocl):
    s, sharing = slabs(pocl)
    keep, freed = s.allocate(pocl, 100), s.allocate(pocl, 100)
    spot = placed(sharing, freed)
    del freed
    gc.collect()
    again = s.allocate(pocl, 90)
    assert placed(sharing, again) == spot != placed(sharing, keep)
    assert len(sharing.blocks) == 1


def test_size_classes_do_not_share_pieces(pocl):
    s, sharing = slabs(pocl)
    small = s.allocate(pocl, 100)
    large = s.allocate(pocl, 100 * 1024)
    (ns, _), (nl, _) = placed(sharing, small), placed(sharing, large)
    assert ns != nl and len(sharing.blocks) == 2


def pending_launch(queue=None) -> tuple[Driver, list]:
    """A driver (no device behind it) whose last CUDA launch records each wait on it."""
    d, waits = object.__new__(Driver), []
    d._queue, d.cuda_pending = queue, SimpleNamespace(wait=lambda: waits.append(1))
    return d, waits


def test_settle_waits_for_the_last_cuda_launch_once():
    d, waits = pending_launch()
    d.settle()
    assert waits == [1] and d.cuda_pending is None
    d.settle()
    assert waits == [1]


def test_the_queue_settles_before_opencl_work():
    queue = object()
    d, waits = pending_launch(queue)
    assert d.queue is queue and waits == [1] and d.cuda_pending is None


def test_a_program_with_a_launched_kernel_launches_all_its_kernels(pocl, monkeypatch):
    """Every kernel of such a program is a ``CudaKernel`` (one without a record: ``PLAIN``, at the
    work-group size OpenCL would give it), so a call never switches between the two contexts; a
    program without one stays on OpenCL."""
    import tile

    src = "function (A[M, N]) -> (B, C) { B = A * 2; C[n, m : N, M] = =(B[m, n]); }"
    built = tile.compile(src, "opencl_cpu.0").prepare(A=np.zeros((64, 48), np.float32)).library
    n = len(built.extra["names"])
    assert n >= 2
    monkeypatch.setattr(LaunchingExecutor, "launcher", lambda self: SimpleNamespace())
    ex = LaunchingExecutor(pocl)

    def library(records):
        extra = {**built.extra, "launch": records}
        return SimpleNamespace(kernels=built.kernels, handle=built.handle, extra=extra)

    assert not any(isinstance(ex.prepare(library([None] * n), i), CudaKernel) for i in range(n))
    record = {"local_bytes": 1024, "maps": []}
    kernels = [ex.prepare(library([None] * (n - 1) + [record]), i) for i in range(n)]
    assert all(isinstance(k, CudaKernel) for k in kernels)
    assert [k.launch for k in kernels] == [PLAIN] * (n - 1) + [record]
    assert all(k.local >= 1 for k in kernels)


def test_launch_arguments_are_built_once_per_kernel_and_addresses():
    launcher = object.__new__(Launcher)
    launcher.argvs, encoded = {}, []
    launcher.tensor_map = lambda at, *rest: encoded.append(at) or 0x9000 + at
    kernel = SimpleNamespace(launch={"maps": [(1, (64, 64), 128, (64, 64), "float16")]})
    first = launcher.arguments(kernel, [0x100, 0x200])
    values = launcher.argvs[(id(kernel), 0x100, 0x200)][1]
    assert [first[i] for i in range(3)] == [ctypes.addressof(a) for a in values]  # pointers to the values
    assert launcher.arguments(kernel, [0x100, 0x200]) is first and encoded == [0x200]  # the map read once
    other = launcher.arguments(kernel, [0x100, 0x300])
    assert other is not first and encoded == [0x200, 0x300]
    assert [a.value for a in launcher.argvs[(id(kernel), 0x100, 0x300)][1]] == [0x100, 0x300, 0x9300]
