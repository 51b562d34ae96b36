"""CUDA tensors on an OpenCL device without crossing the host: ``tile.torch``'s memory for one call
on blocks that CUDA and OpenCL share (``backends.cuda.share``).

Each input is copied device-to-device (torch's ``copy_``, on the current stream: non-contiguous
tensors and dtype conversions included) into a block viewed as a torch tensor; the current stream
is synchronized before OpenCL reads it; the kernels write each output into a block of its own,
which the call waits for and hands to torch as a tensor viewing it. A block goes back to its pool
when the last tensor viewing it is freed (torch holds the ``__cuda_array_interface__`` object it
was made from for the tensor's lifetime; that object's finalizer gives the block back). Work on
other streams than the current one is the caller's to order, as with torch's own allocator.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch

from backends import registry
from backends.cuda.executor import CudaBuffer
from tile.dtypes import DType
from tile.errors import TileError
from tile.tensor import Tensor
from tile.torch_autograd import as_inputs
from tile.torch_dtypes import TO_TORCH

if TYPE_CHECKING:
    from backends.cuda.share import Block, Sharing

PATH = "CUDA memory shared with OpenCL (cl_khr_external_memory_opaque_fd)"


def sharing(tile_device: str, device: torch.device) -> tuple[Sharing | None, str]:
    """The sharing between ``tile_device`` and the CUDA device ``device``, or None and why not."""
    from backends.cuda.share import Sharing  # (pyopencl: only the OpenCL path needs it, ~0.1 s)

    found, why = Sharing.for_device(registry.get(tile_device))
    if found is not None and found.ordinal != device.index:
        return None, f"the tensors are on {device}, but {tile_device} is cuda:{found.ordinal}"
    return found, why


class _View:
    """A block's first ``nbytes`` as CUDA's array interface (bytes, for ``torch.as_tensor``); the
    block goes back to its pool when this object is freed."""

    def __init__(self, block: Block, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "strides": None,  # C-contiguous
            "data": (block.cuda_pointer, False),
            "version": 3,
        }
        weakref.finalize(self, block.give_back)


class Call:
    """The shared blocks of one call on ``program_device`` (a ``backends`` device) from tensors on
    the torch CUDA device ``device``; ``copied`` counts the bytes copied into them."""

    PATH = PATH

    def __init__(self, sharing: Sharing, program_device, device: torch.device):
        self.sharing = sharing
        self.program_device = program_device
        self.device = device
        self.copied = 0
        self._inputs: list[torch.Tensor] = []  # the staged inputs, kept until the run is over

    def input(self, x: torch.Tensor | None, shape, dtype: DType, torch_dtype: torch.dtype) -> Tensor:
        """A ``tile.Tensor`` of ``shape`` and ``dtype`` holding ``x`` (converted, as ``copy_`` does),
        or zeros for None (a missing cotangent)."""
        t, view = self.output(shape, dtype, torch_dtype)
        if x is None:
            view.zero_()
        else:
            view.copy_(x.detach())
            self.copied += view.nbytes
        self._inputs.append(view)
        return t

    def output(self, shape, dtype: DType, torch_dtype: torch.dtype) -> tuple[Tensor, torch.Tensor]:
        """A shared block as a ``tile.Tensor`` (for ``out=``) and as the torch tensor viewing it."""
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.numpy.itemsize
        block = self.sharing.allocate(nbytes)
        raw = torch.as_tensor(_View(block, nbytes), device=self.device)
        return Tensor(self.program_device, block.buffer, shape, dtype), raw.view(torch_dtype).view(shape)

    def ready(self) -> None:
        """CUDA's work on the blocks (the copies in; reads of a reused block's last tensor) is done
        before OpenCL's starts."""
        torch.cuda.current_stream(self.device).synchronize()

    def finish(self, results: list[Tensor]) -> None:
        """OpenCL's work is done before CUDA reads the outputs (the device's queue is in order:
        the inputs' reads too); the input blocks go back to the pool."""
        for r in results:
            r.wait()
        self._inputs.clear()

    def abandon(self) -> None:
        """After a failure part-way: the device's queue drained before the blocks can be reused."""
        try:
            self.sharing.device.queue.finish()
        finally:
            self._inputs.clear()


def direct(tile_device: str) -> bool:
    """Whether ``tile_device`` runs kernels on CUDA memory itself (``cuda.N``)."""
    return tile_device.startswith("cuda.")


def default_device(device: torch.device, fallback: str) -> str:
    """The Tile device for tensors on the torch CUDA device ``device``: ``cuda.<index>`` where
    that device exists, else ``fallback`` (the OpenCL GPU)."""
    want = f"cuda.{device.index if device.index is not None else torch.cuda.current_device()}"
    found = _HAVE.get(want)
    if found is None:  # (once per id: every call asks, and a missing device raises each time)
        try:
            registry.get(want)
            found = True
        except TileError:
            found = False
        _HAVE[want] = found
    return want if found else fallback


_HAVE: dict[str, bool] = {}  # cuda.N -> whether the registry has it


class Direct:
    """One call on ``cuda.N`` from torch CUDA tensors: the kernels read the inputs' memory and write
    the outputs' (``torch.empty``), on torch's current stream, with no copy and no wait (an input
    of another dtype, or not contiguous, is converted by torch first; ``copied`` counts those bytes).
    Nothing to synchronize: the launches are ordered on the stream like torch's own kernels."""

    PATH = "CUDA memory and stream shared with torch (cuda.N)"

    def __init__(self, program_device, device: torch.device):
        self.program_device = program_device
        self.device = device
        self.copied = 0

    def _over(self, t: torch.Tensor, shape, dtype: DType) -> Tensor:
        buf = CudaBuffer.over(self.program_device.executor, t.data_ptr(), t.nbytes, t)
        return Tensor(self.program_device, buf, tuple(int(d) for d in shape), dtype)

    def input(self, x: torch.Tensor | None, shape, dtype: DType, torch_dtype: torch.dtype) -> Tensor:
        if x is None:
            x = torch.zeros(tuple(shape), dtype=torch_dtype, device=self.device)
        else:
            x = x.detach()
            if x.dtype != torch_dtype or not x.is_contiguous() or tuple(x.shape) != tuple(shape):
                x = x.to(torch_dtype).expand(tuple(shape)).contiguous()
                self.copied += x.nbytes
        return self._over(x, shape, dtype)

    def output(self, shape, dtype: DType, torch_dtype: torch.dtype) -> tuple[Tensor, torch.Tensor]:
        t = torch.empty(tuple(int(d) for d in shape), dtype=torch_dtype, device=self.device)
        return self._over(t, shape, dtype), t

    def ready(self) -> None:
        pass

    def finish(self, results: list[Tensor]) -> None:
        pass

    def abandon(self) -> None:
        pass


def shared(op, where, tensors, note: list[str], cotangents=None, wrt=None) -> list | None:
    """The outputs (``wrt`` None) or the gradients for ``wrt`` of ``op``'s call (a
    ``tile.torch.TorchOp``) on CUDA tensors, run in memory CUDA and the Tile device share; None
    where sharing is unavailable or fails (why: added to ``note``)."""
    tile_device, device, _ = where
    if direct(tile_device):  # a CUDA device: the tensors' own memory, torch's stream
        def call_of(program):
            return Direct(program.device, device)
    else:
        shares, why = sharing(tile_device, device)
        if shares is None:
            note.append(f"CUDA memory not shared with OpenCL: {why}")
            return None

        def call_of(program):
            return Call(shares, program.device, device)
    dtypes = [op._np_dtype(t, i) for i, t in enumerate(tensors)]
    key = op.core.key([tuple(t.shape) for t in tensors], dtypes)
    types = op.core.out_types(key)  # a shape or dtype mismatch: in the caller's terms
    call = None
    try:
        program, names = op.core.device_program(tile_device, key, wrt)
        call = call_of(program)
        ins = [call.input(t, t.shape, DType.of(d), t.dtype) for t, d in zip(tensors, dtypes)]
        outs = [call.output(program.buffers[n].sizes, program.buffers[n].dtype,
                            TO_TORCH[program.buffers[n].dtype.numpy]) for n in names]
        if wrt is None:
            call.ready()
            done = op.core.forward_tensors(tile_device, ins, key, [o for o, _ in outs])
        else:
            cots = [
                call.input(c, shape, DType.of(d), TO_TORCH[d]) if DType.of(d).is_float else None
                for c, (shape, d) in zip(cotangents, types)
            ]
            call.ready()
            done = op.core.backward_tensors(tile_device, ins, cots, wrt, key, [o for o, _ in outs])
        call.finish(done)
    except TileError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the shared path: the host path instead
        if call is not None:
            call.abandon()
        note.append(f"CUDA memory sharing failed, so not shared ({type(e).__name__}: {e})")
        return None
    result = [t for _, t in outs]
    if wrt is not None:
        result = as_inputs(result, tensors, wrt)
    op._say(tile_device, f"{call.PATH}: {call.copied} bytes copied device-to-device into "
              "inputs, outputs written in place", [])
    return result
