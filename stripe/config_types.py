"""The data a target config becomes: ``TargetConfig`` (a hardware model and an ordered list of
``PassSpec`` steps) and ``ConfigError``.

Plain data that imports nothing of the passes, so that the pass pipeline can name these types
while ``stripe.config``, which reads files and checks each step against the registered passes,
imports ``stripe.passes``. Import them from ``stripe.config`` (which re-exports them) or here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stripe.hardware import Hardware
from tile.capabilities import Declared
from tile.errors import TileError


class ConfigError(TileError):
    """A target config file that cannot be used: bad JSON, an unknown pass or key, a wrong type."""

    kind = "config error"


@dataclass(frozen=True)
class PassSpec:
    name: str  # this step's name in the pipeline (``--after NAME``)
    pass_: str  # the registered pass it runs
    params: object  # the pass's config dataclass


@dataclass(frozen=True)
class TargetConfig:
    name: str
    hardware: Hardware
    passes: tuple[PassSpec, ...]
    source: str = "<string>"
    device: str = ""  # the device id it is meant for ("device" in the file; the conformance suite
    # runs the compiled families there under --config); empty: any
    # What the file says the target is: documentation, so it takes no part in equality or repr
    # (which the autotuner's cache keys use); ``format_config`` writes it back.
    description: str = field(default="", compare=False, repr=False)
    # What the target declares it supports ("capabilities": operations, dtypes, stages, limits,
    # tolerance class; None: nothing declared): for the conformance suite, not the compiler.
    capabilities: Declared | None = field(default=None, compare=False, repr=False)
    # The modules whose import registers passes the config names that ``stripe.passes`` does not
    # define ("pass_modules": a target package's own passes); what they register is compared.
    pass_modules: tuple[str, ...] = field(default=(), compare=False, repr=False)
