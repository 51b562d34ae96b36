"""A compiled program called on raw addresses: the fast lane of a framework bridge.

``CompiledProgram.run`` is general: numpy arrays or ``tile.Tensor``s in, buffers chosen per call,
events between every operation, outputs handed back as arrays or tensors. A framework op called
again and again at one signature (``tile.torch`` on CPU or CUDA tensors) needs none of that: its
inputs already live where the kernels read (host memory for ``llvm_cpu.0``, CUDA memory for
``cuda.N``), and it allocates the outputs itself (``torch.empty``). A ``Lane`` runs the program's
kernels on those addresses directly:

* each kernel through its executor's ``raw_launcher`` (the LLVM kernel function on an address
  table; ``cuLaunchKernel`` on the caller's stream), in program order;
* the program's temporaries are its own buffers (allocated, and zeroed once where the kernels keep
  them zero, by the general call that came first); those the program needs zeroed before every
  call are zeroed first;
* an output the program needs zeroed must be handed in zeroed (``zeroed_outputs``).

The results are the general path's: the same kernels on the same values. ``Lane.of`` refuses (None)
a program it cannot run this way, and ``__call__`` returns False where this call cannot (work of
the general path still queued on a host device): the caller then takes the general path.
Calls are serialized with the program's general ones (its lock), and ordered after them.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.runner import CompiledProgram, nbytes, picker


class Lane:
    """``program``'s kernels on raw addresses of its inputs (``inputs``, in the caller's order; a
    None name is a place the program reads nothing from) and outputs (``outputs``)."""

    def __init__(self, program: CompiledProgram, inputs: Sequence[str | None], outputs: Sequence[str],
                 launchers: dict, temps: dict[str, int]):  # temps: name -> address
        self.program = program
        self.executor = program.device.executor
        slot = {name: i for i, name in enumerate(inputs) if name is not None}
        base = len(inputs)
        slot.update({name: base + i for i, name in enumerate(outputs)})
        self._zero = [(at, nbytes(program.buffers[n])) for n, at in temps.items() if n in program.zeroed]
        self._fixed = tuple(temps.values())
        tail = base + len(outputs)
        slot.update({name: tail + i for i, name in enumerate(temps)})
        self._plan = [(launchers[k], picker(tuple(slot[n] for n in program._params[k])))
                      for k in program._order]  # (the runner's order: no kernel built empty)
        zero_out = program.zeroed | program._zero_once
        self.zeroed_outputs = tuple(o in zero_out for o in outputs)
        self.output_types = [(tuple(program.buffers[o].sizes), program.buffers[o].dtype) for o in outputs]
        # the events after this lane's last launches on ``_stream`` (``raw_point``), kept while no
        # one has marked them (``raw_unmarked``): the next call on that stream needs no new ones
        self._mark: list | None = None
        self._stream = None

    @classmethod
    def of(cls, program: CompiledProgram, inputs: Sequence[str | None],
           outputs: Sequence[str]) -> Lane | None:
        """The lane of ``program`` for these input and output names, or None where the program
        cannot be run on raw addresses: a kernel its executor cannot launch so, an input some kernel
        writes, an output that is also an input or named twice, an empty buffer, or a temporary the
        general path has not allocated yet."""
        ex = program.device.executor
        names = {n for n in inputs if n is not None}
        if (
            program._written_inputs
            or len(set(outputs)) != len(outputs)
            or names & set(outputs)
            or set(outputs) != set(program.outputs)
            or any(n not in names for n in program.inputs)
            or any(shape.elements == 0 for shape in program.buffers.values())
        ):
            return None
        temps: dict[str, int] = {}
        for n in program._rest:
            if n in outputs:
                continue
            buf = program._owned.get(n)
            if buf is None:
                return None
            temps[n] = ex.raw_address(buf)
        launchers = {k: ex.raw_launcher(program.kernels[k]) for k in program._order}
        if any(go is None for go in launchers.values()):
            return None
        return cls(program, inputs, outputs, launchers, temps)

    def __call__(self, inputs: Sequence[int], outputs: Sequence[int]) -> bool:
        """Run on these addresses (every output at least its buffer's size, zeroed where
        ``zeroed_outputs`` says); False (nothing run) where the general path must take this call."""
        program, ex = self.program, self.executor
        with program._lock:
            if not ex.raw_ready():
                return False
            stream = ex.raw_stream()
            last, mark = program._last, self._mark
            if last and not (last is mark and self._stream is stream and ex.raw_unmarked(mark)):
                ex.raw_after(last, stream)  # (a general call's, or this lane's on another stream)
            for at, n in self._zero:
                ex.raw_zero(at, n, stream)
            addresses = (*inputs, *outputs, *self._fixed)
            for go, pick in self._plan:
                go(pick(addresses), stream)
            if mark is None or self._stream is not stream or not ex.raw_unmarked(mark):
                mark = self._mark = ex.raw_point(stream)
                self._stream = stream
            program._last = mark
        return True


__all__ = ["Lane"]
