"""Whole-program targets: devices that take a program as text and answer its outputs.

A HAL ``Device`` (``backends.hal``) is handed kernels one by one and buffers to run them on; the
runner lowers and optimizes the program for it. A ``ProgramDevice`` is handed the whole program at
one *stage* and the input arrays, and returns the output arrays. That is the shape of a backend
that lives in another process or another language (``backends.external``), or of another Tile
implementation (PlaidML): it has its own compiler and needs only the program and the data.

The stages a program device can take:

* ``tile``: the Tile source (``tile.printer`` of the bound program);
* ``stripe``: the program lowered to Stripe, as Stripe text (``stripe.printer``);
* ``optimized``: the Stripe text after an optimizer config (the device's ``config``, a built-in
  config's name or a file path; ``settings={"config": ...}`` overrides it).

``ProgramRun`` is what ``tile.compile`` builds for such a device: it renders the program once, and
at each call checks that the outputs came back with the names, shapes and dtypes the program has,
so a target that answers wrongly shaped data fails with a ``TileBackendError`` naming it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping

import numpy as np

from backends.hal import STAGES, ProgramDevice
from backends.options import CommonOptions
from tile.dtypes import DType
from tile.errors import TileBackendError, TileInputError
from tile.tensor import Tensor
from tile.typed import BoundProgram

__all__ = ["STAGES", "ProgramDevice", "ProgramRun", "check_outputs", "render", "stage_config"]


def render(bound: BoundProgram, stage: str, config=None) -> str:
    """``bound`` as the text a program device of ``stage`` takes (``config``: a loaded
    ``TargetConfig`` for the ``optimized`` stage)."""
    if stage == "tile":
        from tile.printer import format_program

        return format_program(bound.program)
    from stripe.lower import lower
    from stripe.printer import format_block

    program = lower(bound)
    if stage == "optimized":
        from stripe.passes import optimize

        program = optimize(program, config)
    elif stage != "stripe":
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    return format_block(program)


def stage_config(device: ProgramDevice, settings: Mapping | None):
    """The loaded optimizer config of an ``optimized``-stage device (``settings["config"]``
    first), else None."""
    if device.stage != "optimized":
        return None
    from stripe.config import resolve_config

    config = resolve_config(CommonOptions.parse(settings).config or device.config)
    if config is None:
        raise TileInputError(
            f"{device.id} takes programs optimized by a config, and names none",
            None,
            hint='pass settings={"config": NAME_OR_PATH}',
        )
    return config


class ProgramRun:
    """A bound program ready for a program device (what ``tile.compile`` calls for its inputs)."""

    def __init__(self, bound: BoundProgram, device: ProgramDevice, settings: Mapping | None = None):
        self.bound = bound
        self.device = device
        self.settings = dict(settings or {})
        start = time.perf_counter()
        self.text = render(bound, device.stage, stage_config(device, settings))
        self.build_seconds = time.perf_counter() - start
        self.outputs = {
            name: (bound.types[name].dtype, tuple(int(d) for d in bound.types[name].shape))
            for name in bound.outputs
        }
        self._last: float | None = None

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run(inputs)  # type: ignore[return-value]

    def run(self, inputs: Mapping, out: Mapping | None = None, resident: bool = False) -> dict:
        if out or resident or any(isinstance(v, Tensor) for v in inputs.values()):
            raise TileInputError(
                f"{self.device.id} runs whole programs on host arrays: it has no device tensors, "
                "out= or resident outputs",
                None,
                hint="pass numpy arrays and use the returned arrays",
            )
        arrays = {r: np.asarray(inputs[r], order="C") for r, _ in self.bound.inputs}  # (0-D stays 0-D)
        start = time.perf_counter()
        got = self.device.execute(self.text, arrays, self.outputs)
        self._last = time.perf_counter() - start
        checked = check_outputs(self.device.id, got, self.outputs)
        if os.environ.get("TILE_DEBUG", "0") >= "1":
            print(f"{self.device.id}: whole program in {self._last * 1e3:.3f} ms", file=sys.stderr)
        return checked

    def profile(self) -> list[tuple[str, float]]:
        """The last call as one entry: a program device times the program as a whole."""
        return [] if self._last is None else [(f"{self.device.id}:program", self._last)]


def check_outputs(
    target: str, got, outputs: Mapping[str, tuple[DType, tuple[int, ...]]]
) -> dict[str, np.ndarray]:
    """``got`` as ``{name: array}`` with exactly the names, dtypes and shapes of ``outputs``, or a
    ``TileBackendError`` naming ``target`` and the first thing that is off."""
    if not isinstance(got, Mapping):
        raise TileBackendError(f"{target} answered {type(got).__name__}, not a mapping of outputs")
    if set(got) != set(outputs):
        raise TileBackendError(
            f"{target} answered outputs {sorted(got)}; the program's outputs are {sorted(outputs)}"
        )
    checked = {}
    for name, (dtype, shape) in outputs.items():
        a = got[name]
        if not isinstance(a, np.ndarray):
            raise TileBackendError(f"{target} answered {type(a).__name__} for output '{name}', not an array")
        if a.dtype != dtype.numpy or tuple(a.shape) != shape:
            raise TileBackendError(
                f"{target} answered {a.dtype}{list(a.shape)} for output '{name}'; "
                f"the program makes {dtype.value}{list(shape)}"
            )
        checked[name] = a
    return checked
