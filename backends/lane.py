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

from collections.abc import Mapping, Sequence

from backends.runner import CompiledProgram, debug_on, nbytes, picker
from stripe.ir import Block, RefDir
from stripe.lower import writes_every_element
from stripe.passes.transpose import copy_of
from tile.tensor import Tensor

NATIVE_AFTER = 8  # calls of a lane before its native call is built
ENTRY_ELEMENTS = 1 << 16  # a lane whose buffers hold at most this many elements gets a Python entry


class Lane:
    """``program``'s kernels on raw addresses of its inputs (``inputs``, in the caller's order; a
    None name is a place the program reads nothing from) and outputs (``outputs``)."""

    def __init__(self, program: CompiledProgram, inputs: Sequence[str | None], outputs: Sequence[str],
                 launchers: dict, temps: dict[str, int], aliases: dict[int, tuple[int, int]] | None = None):
        # temps: name -> address; aliases: output place -> (input place, the kernel copying it)
        self.aliases = {o: i for o, (i, _) in (aliases or {}).items()}
        skip = {k for _, k in (aliases or {}).values()}
        self.program = program
        self.executor = program.device.executor
        slot = {name: i for i, name in enumerate(inputs) if name is not None}
        base = len(inputs)
        slot.update({name: base + i for i, name in enumerate(outputs)})
        self._zero = [(at, nbytes(program.buffers[n])) for n, at in temps.items() if n in program.zeroed]
        self._fixed = tuple(temps.values())
        tail = base + len(outputs)
        slot.update({name: tail + i for i, name in enumerate(temps)})
        run = [k for k in program._order if k not in skip]  # (the runner's order: none built empty)
        # the input places a call needs: read by a kernel it runs, or given back as an output
        self.used = frozenset(
            {slot[n] for k in run for n in program._params[k] if n in slot and slot[n] < base}
            | set(self.aliases.values()))
        self._plan = [(launchers[k], picker(tuple(slot[n] for n in program._params[k]))) for k in run]
        self.native = False  # the plan is one native call (``_one_call``)
        # (kernels, addresses) for ``_one_call`` once the lane has run ``NATIVE_AFTER`` times: a
        # lane used once or twice (a new length in a loop over shapes) pays no 5 ms build
        self._native_later = ([program.kernels[k] for k in run], tail + len(temps)) if run else None
        self._calls = 0
        # the native call as a Python builtin (``raw_entry``), for a lane of little work that
        # zeroes nothing before its kernels: ``entry(*addresses)``, one call, no ctypes
        self._entry = None
        self.on_entry = None  # called once the entry is made (``tile.torch_hot``: its call compiled)
        self._small = not self._zero and sum(b.elements for b in program.buffers.values()) <= ENTRY_ELEMENTS
        zero_out = program.zeroed | program._zero_once
        self.zeroed_outputs = tuple(o in zero_out for o in outputs)
        self.output_types = [(tuple(program.buffers[o].sizes), program.buffers[o].dtype) for o in outputs]
        # the events after this lane's last launches on ``_stream`` (``raw_point``), kept while no
        # one has marked them (``raw_unmarked``): the next call on that stream needs no new ones
        self._mark: list | None = None
        self._stream = None

    @property
    def runs_nothing(self) -> bool:
        """Whether a call launches no kernel and zeroes nothing (every output an input's alias)."""
        return not self._plan and not self._zero

    def _one_call(self, kernels: list, count: int) -> None:
        """Where the executor can run the kernels as one native call (``raw_sequence``: on
        ``llvm_cpu``, every kernel one chunk on this thread), the plan becomes that call: one
        foreign call a run instead of a table fill and a call per kernel (about 1 us each; an
        exported transformer block runs 33). The kernels, their order and their buffers are the
        plan's, so the results are its bits. A lane of little work also gets the call as a
        Python builtin (``raw_entry``: ~0.06 us a call, not ~0.8); a lane of one kernel only
        that (its plan is already one foreign call)."""
        make = getattr(self.executor, "raw_sequence", None)
        entry = getattr(self.executor, "raw_entry", None) if self._small else None
        if make is None or len(kernels) == 1 and entry is None:
            return
        positions = tuple(range(count))
        one = make(kernels, [pick(positions) for _, pick in self._plan], count)
        if one is not None:
            self._plan = [(one, _whole)]
            self.native = True
            if entry is not None:
                self._entry = entry(one, count - len(self._fixed), self._fixed)
                if self._entry is not None and self.on_entry is not None:
                    self.on_entry()

    @classmethod
    def of(cls, program: CompiledProgram, inputs: Sequence[str | None],
           outputs: Sequence[str], alias: bool = False) -> Lane | None:
        """The lane of ``program`` for these input and output names, or None where the program
        cannot be run on raw addresses: a kernel its executor cannot launch so, an input some kernel
        writes, an output that is also an input or named twice, an empty buffer, or a temporary the
        general path has not allocated yet. ``alias``: an output that is an input unchanged
        (``copies``) is that input (its place in ``aliases``, its copy not run): the caller hands in
        the input's address for it, and gives the input back as that output."""
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
        aliases = copies(program, inputs, outputs) if alias else None
        return cls(program, inputs, outputs, launchers, temps, aliases)

    def __call__(self, inputs: Sequence[int], outputs: Sequence[int]) -> bool:
        """Run on these addresses (every output at least its buffer's size, zeroed where
        ``zeroed_outputs`` says); False (nothing run) where the general path must take this call."""
        return self.run((*inputs, *outputs))

    def run(self, addresses: tuple) -> bool:
        """``__call__`` with the inputs' then the outputs' addresses in one tuple (the form a
        small ``tile.torch`` call takes: ``tile.torch_hot``). On a host executor (``raw_host``)
        there is no stream, and nothing to mark after the launches, which have run when it
        returns; a lane with an entry (``_one_call``) runs as that one builtin call."""
        program, ex = self.program, self.executor
        with program._lock:
            if not ex.raw_ready():
                return False
            entry = self._entry  # (a host's: no stream, nothing to mark)
            if entry is not None and not program._last:
                entry.fn(*addresses)
                return True
            if self._native_later is not None:
                self._count_call()
            last, host = program._last, ex.raw_host
            if host:
                stream = mark = None
                if last:
                    ex.raw_after(last, None)  # (a general call's events)
                    program._last = []
                if entry is not None:
                    entry.fn(*addresses)
                    return True
            else:
                stream, mark = ex.raw_stream(), self._mark
                if last and not (last is mark and self._stream is stream and ex.raw_unmarked(mark)):
                    ex.raw_after(last, stream)  # (a general call's, or this lane's on another stream)
            for at, n in self._zero:
                ex.raw_zero(at, n, stream)
            addresses += self._fixed
            for go, pick in self._plan:
                go(pick(addresses), stream)
            if not host:
                if mark is None or self._stream is not stream or not ex.raw_unmarked(mark):
                    mark = self._mark = ex.raw_point(stream)
                    self._stream = stream
                program._last = mark
        return True

    def _count_call(self) -> None:
        """One more call of the lane: at ``NATIVE_AFTER``, its native call."""
        self._calls += 1
        if self._calls >= NATIVE_AFTER:
            self._one_call(*self._native_later)
            self._native_later = None


def _whole(addresses):
    return addresses


def copies(program: CompiledProgram, inputs: Sequence[str | None], outputs: Sequence[str]) -> dict:
    """``{output place: (input place, kernel)}`` for each output that exactly one kernel writes, a
    copy (``copy_of``: loads, identity casts, a store) of an input of the same shape, dtype and
    layout, through the same access, onto every element (no constraint), kept zero by no one: its
    values are that input's."""
    places = {name: i for i, name in enumerate(inputs) if name is not None}
    writers: dict[str, list[int]] = {}
    blocks = {k: program.kernels[k].info.block for k in program._order}
    if not all(isinstance(b, Block) for b in blocks.values()):
        return {}  # (a kernel of no Stripe block: what it writes is not known here)
    for k in program._order:
        for r in blocks[k].refs:
            if r.dir != RefDir.IN:
                writers.setdefault(r.from_ or r.into, []).append(k)
    zeroed = program.zeroed | program._zero_once
    found = {}
    for o, name in enumerate(outputs):
        ks = writers.get(name, [])
        if len(ks) != 1 or name in zeroed:
            continue
        block = blocks[ks[0]]
        pair = copy_of(block)
        if pair is None or block.constraints:
            continue
        refs = {r.into: r for r in block.refs}
        src, out = refs[pair[0]], refs[pair[1]]
        source = src.from_ or src.into
        if (out.from_ or out.into) != name or source not in places:
            continue
        shape = program.buffers[name]
        if (program.buffers[source] == shape and src.access == out.access and src.shape == out.shape
                and writes_every_element(out.access, block.idxs, tuple(shape.sizes))):
            found[o] = (places[source], ks[0])
    return found


def resident_call(program: CompiledProgram, inputs: Mapping, out: Mapping) -> dict | None:
    """``program.run(inputs, out)`` when every input is a ``tile.Tensor`` of its host device and
    ``out`` gives a tensor for every output (a resident loop: weights and results stay put), run
    through a ``Lane`` on the tensors' addresses, without the general path's events and
    bindings: the same kernels on the same memory. None where the general path must take the
    call: before the program's first call, on a device without host raw calls, an output the
    program needs zeroed, a tensor of another device or type, one buffer given twice, a name
    too many, work still queued, or ``TILE_DEBUG``."""
    lane = getattr(program, "_resident_lane", False)  # (False: not a ``CompiledProgram``)
    if lane is None:
        if not program._checked:
            return None  # (the first call allocates the temporaries a lane runs on)
        ex = program.device.executor
        lane = Lane.of(program, program.inputs, program.outputs) if ex.raw_host else None
        if lane is None or any(lane.zeroed_outputs):
            lane = False
        program._resident_lane = lane
    if lane is False or len(inputs) != len(program.inputs) or len(out) != len(program.outputs):
        return None
    device, types = program.device, program._out_types
    ins, outs = [], []
    for name in program.inputs:
        t = inputs.get(name)
        if type(t) is not Tensor or t._device is not device:
            return None
        ins.append(t._buffer.address)
    for name in program.outputs:
        t = out.get(name)
        if type(t) is not Tensor or t._device is not device or (t._shape, t._dtype) != types[name]:
            return None
        outs.append(t._buffer.address)
    if len(set(ins) | set(outs)) != len(ins) + len(outs) or debug_on() or not lane(ins, outs):
        return None
    for t in out.values():
        t._events = []  # (ran on this thread: done)
    return {name: out[name] for name in program.outputs}


__all__ = ["ENTRY_ELEMENTS", "NATIVE_AFTER", "Lane", "copies", "resident_call"]
