"""The CUDA driver calls of ``backends.cuda.share`` (CUDA memory OpenCL imports) and
``backends.cuda.launch`` (kernels of an OpenCL program launched through CUDA), made through
NVIDIA's bindings (``cuda.bindings.driver``), checked without a GPU: ``runtime.cu`` is replaced by
``FakeDriver``, which keeps the bindings' real types and enums but answers the calls itself and
records them. On an H100, tests/test_cuda_share.py and tests/test_tma_gpu.py run the real calls
(``.gpu/g5.sh``).
"""

from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace

import pytest

from backends.cuda import launch, runtime, share
from backends.cuda.launch import CudaEvent, Launcher, LaunchingExecutor, LaunchRefused
from backends.cuda.runtime import CudaError
from backends.cuda.share import EXTENSIONS, Sharing
from backends.opencl.driver import Driver
from tile.errors import TileDeviceError

real = pytest.importorskip("cuda.bindings.driver", reason="needs cuda-bindings (its types and enums)")

GRANULE = 2 << 20
UUIDS = {0: b"\x01" * 16, 1: b"\x02" * 16}


class FakeDriver:
    """``cuda.bindings.driver`` for two devices (UUIDs ``UUIDS``): types and enums are the real
    module's; each call answers ``(CUDA_SUCCESS, values...)`` and is recorded in ``calls`` as
    ``(name, args)``, and a call named in ``fail`` answers ``CUDA_ERROR_OUT_OF_MEMORY``."""

    def __init__(self, fail=(), capability=(9, 0), query=None):
        self.calls, self.fail, self.capability, self.query = [], set(fail), capability, query
        self.fds: list[int] = []  # the file descriptors exported
        ok = real.CUresult.CUDA_SUCCESS
        attr = real.CUdevice_attribute
        answers = {
            "cuInit": lambda flags: (),
            "cuDeviceGetCount": lambda: (2,),
            "cuDeviceGet": lambda n: (real.CUdevice(n),),
            "cuDeviceGetUuid": lambda dev: (SimpleNamespace(bytes=UUIDS[int(dev)]),),
            "cuDevicePrimaryCtxRetain": lambda dev: (real.CUcontext(0x100 + int(dev)),),
            "cuCtxPushCurrent": lambda ctx: (),
            "cuCtxPopCurrent": lambda: (real.CUcontext(0),),
            "cuCtxSynchronize": lambda: (),
            "cuMemGetAllocationGranularity": lambda prop, option: (GRANULE,),
            "cuMemCreate": lambda size, prop, flags: (real.CUmemGenericAllocationHandle(0x55),),
            "cuMemAddressReserve": lambda size, align, addr, flags: (real.CUdeviceptr(0x7F0000000000),),
            "cuMemMap": lambda *args: (),
            "cuMemSetAccess": lambda *args: (),
            "cuMemExportToShareableHandle": lambda handle, kind, flags: (self._export(),),
            "cuMemUnmap": lambda *args: (),
            "cuMemAddressFree": lambda *args: (),
            "cuMemRelease": lambda *args: (),
            "cuDeviceGetAttribute": lambda which, dev: ({
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.capability[0],
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.capability[1],
                attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
            }[which],),
            "cuStreamCreate": lambda flags: (real.CUstream(0x5),),
            "cuMemAlloc": lambda size: (real.CUdeviceptr(0x900000),),
            "cuTensorMapEncodeTiled": lambda *args: (real.CUtensorMap(),),
            "cuMemcpyHtoD": lambda *args: (),
            "cuStreamSynchronize": lambda stream: (),
            "cuEventQuery": lambda event: (),
        }
        for name, answer in answers.items():
            setattr(self, name, self._recorded(name, answer, ok))

    def _recorded(self, name, answer, ok):
        def call(*args):
            self.calls.append((name, args))
            if name in self.fail:
                return (real.CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
            if name == "cuEventQuery" and self.query is not None:
                return (self.query,)
            return (ok, *answer(*args))

        return call

    def _export(self) -> int:
        fd = os.open(os.devnull, os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def cuGetErrorName(self, err):
        return real.CUresult.CUDA_SUCCESS, err.name.encode()

    def __getattr__(self, name: str):
        if name.startswith(("CU", "cuuint")):  # the bindings' types and enums
            return getattr(real, name)
        raise AttributeError(f"FakeDriver has no {name}")

    def named(self, *names: str) -> list[tuple]:
        return [(n, a) for n, a in self.calls if n in names]


@pytest.fixture
def fake(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(runtime, "cu", driver)
    return driver


def fake_device(extensions=EXTENSIONS) -> Driver:
    """An OpenCL driver object with no device behind it: what the probes read."""
    dev = object.__new__(Driver)
    dev.id, dev.name, dev.extensions = "opencl_gpu.9", "Fake H100", frozenset(extensions)
    dev.cl_device = SimpleNamespace(int_ptr=id(dev))
    return dev


def imported(monkeypatch) -> list[tuple]:
    """Replace OpenCL's import of an exported fd: record (fd, size, whether fd is open) and give a
    buffer that records its release."""
    seen = []

    def import_fd(lib, device, fd, size):
        os.fstat(fd)  # (raises if the fd is not open)
        seen.append((fd, size))
        return SimpleNamespace(release=lambda: seen.append(("released", size)))

    monkeypatch.setattr(share, "_import_fd", import_fd)
    return seen


def test_a_block_is_pinned_device_memory_exported_as_a_posix_fd(fake):
    prop, access = share.allocation(1)
    assert prop.type == real.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    fd = real.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    assert prop.requestedHandleTypes == fd
    assert (prop.location.type, prop.location.id) == (real.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, 1)
    assert (access.location.type, access.location.id) == (prop.location.type, 1)
    assert access.flags == real.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE


def test_sharing_makes_maps_exports_and_imports_a_block(fake, monkeypatch):
    seen = imported(monkeypatch)
    sharing = Sharing(fake_device(), None, 1)
    assert sharing.granularity == GRANULE and int(sharing.cuda_device) == 1
    (_, (prop, option)), = fake.named("cuMemGetAllocationGranularity")
    assert option == real.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    assert prop.location.id == 1
    fake.calls.clear()
    block = sharing.allocate(GRANULE + 1)  # two granules
    size = 2 * GRANULE
    assert (block.size, block.cuda_pointer, block.handle) == (size, 0x7F0000000000, 0x55)
    assert block.buffer.cuda_pointer == block.cuda_pointer and block.buffer.size == size
    names = [n for n, _ in fake.calls]
    assert names == ["cuCtxPushCurrent", "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                     "cuMemExportToShareableHandle", "cuCtxPopCurrent"]
    args = dict(fake.calls)
    assert args["cuCtxPushCurrent"] == (sharing._ctx,) and int(sharing._ctx) == 0x101  # the primary context
    assert args["cuMemCreate"][0] == size and args["cuMemCreate"][1] is sharing._prop
    assert args["cuMemAddressReserve"] == (size, 0, 0, 0)
    assert [int(a) for a in args["cuMemMap"]] == [0x7F0000000000, size, 0, 0x55, 0]
    ptr, nbytes, (desc,), count = args["cuMemSetAccess"]
    assert (int(ptr), nbytes, count) == (0x7F0000000000, size, 1)
    assert desc.flags == real.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    kind = args["cuMemExportToShareableHandle"][1]
    assert kind == real.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    assert seen == [(fake.fds[0], size)]
    with pytest.raises(OSError):  # the exported fd is closed once OpenCL has imported it
        os.fstat(fake.fds[0])
    assert sharing.blocks == 1


def test_a_failed_cuda_call_names_itself_and_takes_back_what_was_done(fake, monkeypatch):
    imported(monkeypatch)
    sharing = Sharing(fake_device(), None, 0)
    fake.fail.add("cuMemMap")
    fake.calls.clear()
    with pytest.raises(CudaError, match=r"^cuMemMap failed: CUDA_ERROR_OUT_OF_MEMORY$"):
        sharing.allocate(100)
    undone = [n for n, _ in fake.calls if n in ("cuMemUnmap", "cuMemAddressFree", "cuMemRelease")]
    assert undone == ["cuMemAddressFree", "cuMemRelease"]  # in reverse; nothing was mapped
    pushes = [n for n, _ in fake.calls if n.startswith("cuCtxP")]
    assert pushes == ["cuCtxPushCurrent", "cuCtxPopCurrent"] * 2  # the context restored both times
    assert sharing.blocks == 0 and not fake.fds


def test_trim_waits_then_frees_opencl_first_then_cuda(fake, monkeypatch):
    seen = imported(monkeypatch)
    sharing = Sharing(fake_device(), None, 0)
    sharing.allocate(10).give_back()
    fake.calls.clear()
    sharing.trim()
    assert seen[-1] == ("released", GRANULE)
    names = [n for n, _ in fake.calls if not n.startswith("cuCtxP")]
    assert names == ["cuCtxSynchronize", "cuMemUnmap", "cuMemAddressFree", "cuMemRelease"]
    args = dict(fake.calls)
    assert args["cuMemUnmap"] == args["cuMemAddressFree"] == (0x7F0000000000, GRANULE)
    assert args["cuMemRelease"] == (0x55,) and sharing.blocks == 0


@pytest.fixture
def probing(fake, monkeypatch):
    """``Sharing.for_device`` and ``Launcher.for_device`` probing anew, OpenCL's UUID ``UUIDS[1]``."""
    monkeypatch.setattr(Sharing, "_found", {})
    monkeypatch.setattr(Launcher, "_found", {})
    for name in ("TILE_CUDA_SHARING", "TILE_CUDA_LAUNCH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(share, "_opencl_library", lambda: SimpleNamespace(clCreateBufferWithProperties=None))
    monkeypatch.setattr(share, "_cl_uuid", lambda lib, dev: UUIDS[1])
    return fake


def test_sharing_finds_the_cuda_device_by_uuid(probing):
    found, why = Sharing.for_device(fake_device())
    assert why == "" and found.ordinal == 1


def test_sharing_says_no_cuda_device_has_the_uuid(probing, monkeypatch):
    monkeypatch.setattr(share, "_cl_uuid", lambda lib, dev: b"\x07" * 16)
    assert Sharing.for_device(fake_device()) == (None, f"no CUDA device has opencl_gpu.9's UUID {'07' * 16}")


def test_without_the_bindings_sharing_and_launching_say_to_install_the_extra(probing, monkeypatch):
    monkeypatch.setattr(runtime, "cu", None)
    dev = fake_device()
    found, why = Sharing.for_device(dev)
    assert found is None and "pip install 'tile[cuda]'" in why
    launcher, why = Launcher.for_device(dev)
    assert launcher is None and why.startswith("no memory shared with CUDA (") and "tile[cuda]" in why
    ex = object.__new__(LaunchingExecutor)
    ex.device = dev
    library = SimpleNamespace(extra={"launch": [{"local_bytes": 1024, "maps": []}], "names": ["tile_k0"]})
    with pytest.raises(TileDeviceError, match=r"cannot launch kernel tile_k0 through CUDA: .*tile\[cuda\]"):
        ex.prepare(library, 0)
    assert issubclass(LaunchRefused, RuntimeError)  # (what it raised before it was a TileError)


def test_a_launcher_needs_compute_capability_9_0(probing):
    probing.capability = (8, 0)
    launcher, why = Launcher.for_device(fake_device())
    assert launcher is None and why == "the CUDA device has compute capability 8.0, not 9.0 (sm_90a kernels)"


def test_a_launcher_gets_a_stream_and_the_opt_in_local_memory(probing):
    launcher, why = Launcher.for_device(fake_device())
    assert why == "" and launcher.launch_bytes == 232448
    (_, (flags,)), = probing.named("cuStreamCreate")
    assert flags == real.CUstream_flags.CU_STREAM_NON_BLOCKING
    assert probing.named("cuMemAlloc") == [("cuMemAlloc", (128 * launch.MAP_SLOTS,))]
    assert launcher.maps_at == 0x900000


def test_tensor_maps_are_encoded_once_per_key_into_consecutive_slots(probing):
    launcher, _ = Launcher.for_device(fake_device())
    first = launcher.tensor_map(0x1000, (64, 256), 512, (64, 64), "float16")
    second = launcher.tensor_map(0x2000, (64, 256), 512, (64, 64), "tfloat32")
    assert launcher.tensor_map(0x1000, (64, 256), 512, (64, 64), "float16") == first
    assert (first, second) == (0x900000, 0x900000 + 128)
    encoded = [a for _, a in probing.named("cuTensorMapEncodeTiled")]
    assert len(encoded) == 2
    kind, rank, at, dims, strides, box, step, _, swizzle, l2, _ = encoded[0]
    assert (kind, rank, at) == (real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, 0x1000)
    assert [int(d) for d in dims] == [64, 256] and [int(s) for s in strides] == [512]
    assert [int(b) for b in box] == [64, 64] and [int(s) for s in step] == [1, 1]
    assert swizzle == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert l2 == real.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B
    assert encoded[1][0] == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_TFLOAT32
    copies = probing.named("cuMemcpyHtoD")
    assert [(a[0], a[2]) for _, a in copies] == [(0x900000, 128), (0x900000 + 128, 128)]


def test_launch_arguments_point_at_64_bit_values(probing):
    launcher, _ = Launcher.for_device(fake_device())
    kernel = SimpleNamespace(launch={"maps": [(0, (64, 64), 128, (64, 64), "bfloat16")]})
    argv = launcher.arguments(kernel, [0x1000, 0x2000])
    assert [ctypes.c_uint64.from_address(argv[i]).value for i in range(3)] == [0x1000, 0x2000, 0x900000]


@pytest.mark.parametrize("status, expect", [("CUDA_SUCCESS", True), ("CUDA_ERROR_NOT_READY", False),
                                            ("CUDA_ERROR_LAUNCH_FAILED", CudaError)])
def test_a_launch_event_is_complete_pending_or_a_named_error(probing, status, expect):
    launcher, _ = Launcher.for_device(fake_device())
    probing.query = getattr(real.CUresult, status)
    event = CudaEvent(launcher, real.CUevent(1), real.CUevent(2), False)
    if expect is CudaError:
        with pytest.raises(CudaError, match=r"^cuEventQuery failed: CUDA_ERROR_LAUNCH_FAILED$"):
            event.complete  # noqa: B018
    else:
        assert event.complete is expect


def test_uuids_reads_both_calls_where_the_bindings_have_both(fake, monkeypatch):
    assert runtime.uuids(1) == {UUIDS[1]}
    fake.cuDeviceGetUuid_v2 = lambda dev: (real.CUresult.CUDA_SUCCESS, SimpleNamespace(bytes=b"\x09" * 16))
    assert runtime.uuids(1) == {UUIDS[1], b"\x09" * 16}
