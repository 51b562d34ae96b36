"""Seeded defects (``conformance/mutants/README.md``): every mutant by name, and the factory that
``backends.registry`` calls for a ``mutant:NAME`` id."""

from __future__ import annotations

from conformance.mutants import llvm_text, opencl_text, stripe_level
from conformance.mutants.base import Mutant, Witness
from tile.errors import TileDeviceError

MUTANTS: dict[str, Mutant] = {
    m.name: m for m in stripe_level.MUTANTS + llvm_text.MUTANTS + opencl_text.MUTANTS
}
PREFIX = "mutant:"


def device(device_id: str):
    """The device ``mutant:NAME``: its base device with the defect in its compiler."""
    from backends import registry
    from conformance.mutants.wrapper import MutantDevice

    name = device_id.removeprefix(PREFIX)
    mutant = MUTANTS.get(name)
    if mutant is None:
        raise TileDeviceError(
            f"no seeded defect '{name}'",
            None,
            hint="`python -m conformance.mutants --list` lists them",
        )
    return MutantDevice(mutant, registry.get(mutant.base_id))


__all__ = ["MUTANTS", "Mutant", "Witness", "device"]
