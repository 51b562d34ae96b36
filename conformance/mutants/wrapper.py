"""The mutant device: a real device whose compiler applies one seeded defect.

Stripe-level defects rewrite each kernel's block at the Stripe -> code generator boundary (the
``KernelInfo`` list ``Compiler.build`` receives). Text-level defects rewrite what the real code
generator printed, before it is parsed (LLVM) or compiled (OpenCL): the device's compiler module
looks its generator up by name at each build, so the build runs with that name bound, for its
duration, to the generator followed by the rewrite. Nothing in the generators is edited.

With ``TILE_MUTANT_LOG=F`` in the environment each build appends ``NAME applied|unchanged`` to F
(``python -m conformance.mutants`` reports a mutant that was never applied).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace

from backends.hal import Compiler, Device, KernelInfo, Library
from backends.options import NO_FACTS, BuildFacts, build_library
from conformance.mutants.base import Mutant

# the module whose global ``generate`` each text level's compiler calls, and how its result holds text
_GENERATORS = {"llvm": "backends.llvm.device", "opencl": "backends.opencl.compiler"}
_LOCK = threading.RLock()


class MutantCompiler(Compiler):
    def __init__(self, real: Compiler, mutant: Mutant):
        self.real = real
        self.mutant = mutant
        self.builds = 0
        self.applied = 0  # builds the rewrite changed

    def build(self, kernels: Sequence[KernelInfo], settings: dict, facts: BuildFacts = NO_FACTS) -> Library:
        changed = [False]
        if self.mutant.level == "stripe":
            out = []
            for k in kernels:
                block = self.mutant.rewrite(k.block)
                changed[0] |= block != k.block
                out.append(replace(k, block=block))
            library = build_library(self.real, out, settings, facts)
        else:
            library = self._build_text(kernels, settings, changed, facts)
        self.builds += 1
        self.applied += changed[0]
        log = os.environ.get("TILE_MUTANT_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{self.mutant.name} {'applied' if changed[0] else 'unchanged'}\n")
        return library

    def _build_text(self, kernels, settings, changed, facts=NO_FACTS) -> Library:
        # no object cache: the LLVM device looks its plan up before generating any IR, so a plan
        # the real device built (or this one did, in another process) would bypass the rewrite
        settings = {**settings, "cache": False}
        module = sys.modules[_GENERATORS[self.mutant.level]]
        real_generate = module.generate
        rewrite = self.mutant.rewrite

        def text(s: str) -> str:
            new = rewrite(s)
            changed[0] |= new != s
            return new

        def generate(*args, **kwargs):
            made = real_generate(*args, **kwargs)
            if isinstance(made, str):  # LLVM: the module's IR text
                return text(made)
            return [replace(s, text=text(s.text)) for s in made]  # OpenCL: one KernelSource a kernel

        with _LOCK:
            module.generate = generate
            try:
                return build_library(self.real, kernels, settings, facts)
            finally:
                module.generate = real_generate


class MutantDevice(Device):
    """``mutant:NAME``: the base device in everything but its compiler."""

    def __init__(self, mutant: Mutant, base: Device):
        self.id = mutant.device_id
        self.base = base
        self.mutant = mutant
        self.description = f"{base.id} with a seeded defect: {mutant.what}"
        self.capabilities = base.capabilities
        self.compiler = MutantCompiler(base.compiler, mutant)
        self.executor = base.executor

    @property
    def optimizer(self) -> str:  # type: ignore[override]
        return self.base.optimizer

    @property
    def tiled_optimizer(self) -> str:
        return self.base.tiled_optimizer

    def memory_bytes(self):
        return self.base.memory_bytes()

    def hardware(self, hw):
        return self.base.hardware(hw)

    def tuning_space(self, library: Library) -> list[dict]:
        return self.base.tuning_space(library)

    def __getattr__(self, name: str):  # anything else a backend's executor asks its device for
        if name in ("base", "mutant"):
            raise AttributeError(name)
        return getattr(self.base, name)
