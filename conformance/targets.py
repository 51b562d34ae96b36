"""What a conformance run validates, and which share of the examples this run takes.

A ``Subject`` is one parametrization of the suite's ``target``: a device (built in, a plugin's,
or ``external:COMMAND``) compiled with its own config; a device compiled with a user's config
(``--config F.json`` with ``--target ID``, or the device the config names); or a user's config
alone, whose passes the Stripe interpreter checks (``stripe:<name>``: a config that names no
device, run without ``--target``).

``--conformance-shard=I/N`` splits the examples by a hash of each example's program and inputs:
every example Hypothesis draws is checked by exactly one of the N shards. Every shard decides
alike whether an example is valid (parsed and bound, of dtypes the target has, accepted by the
interpreter: an invalid one is rejected with ``assume`` in every shard), and a valid example of
another shard passes without being compiled. So Hypothesis's draws, which depend on which examples
were rejected, are the same in every shard, and the N shards together count, as compared, invalid
or unsupported, exactly the examples one unsharded run with the same seed does; each shard counts
the rest as "other shard", and the shards' fingerprints XOR to the unsharded run's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np

from stripe.config import TargetConfig, builtin_names, target_config
from tile.capabilities import Declared
from tile.dtypes import DType

SMALL_BYTES = 256
NO_DEVICE = "<none>"  # the target of a default run (every device) on a machine that has none


def small(cfg: TargetConfig) -> TargetConfig:
    hw = cfg.hardware
    mems = {k: replace(m, size_KiB=SMALL_BYTES / 1024) for k, m in hw.mem_units.items()}
    units = {
        k: replace(u, count=min(u.count, 2), threads=min(u.threads, 4)) for k, u in hw.exec_units.items()
    }
    return replace(cfg, name=f"{cfg.name}-small", hardware=replace(hw, mem_units=mems, exec_units=units))


@dataclass(frozen=True)
class Param:
    """One ``target`` parametrization, as collected (devices are looked up in the fixture)."""

    name: str  # as reported, in the summary and the failure folders
    device_id: str | None  # None: the config's passes only
    config: str | None = None  # a user's config file
    # the optimized family checks every built-in config's passes under this subject (the run's
    # first device): they do not depend on the target, so the others check only their own configs
    every_config: bool = True

    def __str__(self) -> str:
        return self.name


def params(targets: list[str], configs: list[TargetConfig]) -> list[Param]:
    """The subjects of a run: each target as it is or, under ``--config``, each config on each
    given target (else on the device it names, else alone)."""
    if not configs:
        return [Param(t, t if t != NO_DEVICE else None, every_config=k == 0) for k, t in enumerate(targets)]
    out = []
    for cfg in configs:
        devices = targets or ([cfg.device] if cfg.device else [])
        if not devices:
            out.append(Param(f"stripe:{cfg.name}", None, cfg.source))
        out += [Param(f"{d}+{cfg.name}", d, cfg.source) for d in devices]
    return out


@dataclass
class Subject:
    """A ``Param`` with its device found: what ``test_conformance.check`` validates."""

    name: str
    device: object | None  # backends.hal.Device or backends.program.ProgramDevice; None: passes only
    config: TargetConfig | None = None  # a user's config (None: the device's own)
    settings: dict = field(default_factory=dict)  # for tile.compile
    every_config: bool = True  # Param.every_config

    def supports(self, dtype: DType) -> bool:
        return self.device is None or self.device.capabilities.supports(dtype)

    @property
    def declared(self) -> Declared | None:
        """What the subject declares: its device's declaration narrowed by the user's config's
        ``"capabilities"`` (None: nothing declared; ``conformance.capabilities`` uses it)."""
        own = getattr(self.device.capabilities, "declared", None) if self.device is not None else None
        cfg = self.config.capabilities if self.config is not None else None
        return cfg if own is None else own.restrict(cfg)

    def has_fp64(self) -> bool:
        """Whether the device computes in float64 (``supports`` says whether it takes the dtype)."""
        return self.device is None or getattr(self.device.capabilities, "fp64", True)

    def pass_configs(self) -> tuple[TargetConfig, ...] | None:
        """The configs whose passes the ``optimized`` family checks (None: every built-in one):
        the user's config; else every built-in one under the run's first device
        (``every_config``), and the device's own (its optimizer and tiled optimizer) under the
        others, since a config's passes give the same result whatever the target."""
        if self.config is not None:
            return (self.config, small(self.config))
        if self.every_config or self.device is None:
            return None
        own = [getattr(self.device, a, "") for a in ("optimizer", "tiled_optimizer")]
        cfgs = [target_config(n) for n in own if n in builtin_names()]
        return tuple(c for cfg in cfgs for c in (cfg, small(cfg)))

    def compile_settings(self, passes: bool) -> list[dict]:
        """One settings dict per compiled run of an example: the device's own config (or the
        user's); with ``passes``, also its built-in tiled pipeline where it has one."""
        if self.device is None:
            return []
        runs = [dict(self.settings)]
        tiled = getattr(self.device, "tiled_optimizer", "")
        declared = self.declared
        optimized = declared is None or declared.allows_stage("optimized")  # a config's passes first
        if passes and self.config is None and tiled in builtin_names() and optimized:
            runs.append({**self.settings, "config": tiled})
        return runs

    def known_difference(self, source: str, problem: str) -> str | None:
        """The documented reason this target differs on ``source``, if its device declares one."""
        known = getattr(self.device, "known_difference", None)
        return known(source, problem) if known is not None else None


def as_subject(target) -> Subject:
    """A device passed where a subject is expected (tests call ``check`` with a device)."""
    return target if isinstance(target, Subject) else Subject(target.id, target)


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int

    @staticmethod
    def parse(text: str) -> Shard:
        """``I/N`` with 0 <= I < N; a ``ValueError`` saying so otherwise."""
        try:
            i, n = (int(p) for p in text.split("/"))
        except ValueError:
            raise ValueError(f"--conformance-shard={text}: write I/N, e.g. 0/4") from None
        if n < 1 or not 0 <= i < n:
            raise ValueError(f"--conformance-shard={text}: I must be in 0..N-1 and N at least 1")
        return Shard(i, n)

    def takes(self, digest: str) -> bool:
        """Whether the example of this ``example_digest`` is this shard's."""
        return self.count == 1 or int(digest[:15], 16) % self.count == self.index


def example_digest(source: str, inputs: dict[str, np.ndarray]) -> str:
    """A hash of a program and its inputs (the failure folders are named by it too)."""
    digest = hashlib.sha1(source.encode())
    for k in sorted(inputs):
        a = np.ascontiguousarray(inputs[k])
        digest.update(f"{k}:{a.dtype}:{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


SHARD = Shard(0, 1)  # the run's shard (conftest sets it from --conformance-shard)
FOCUS: frozenset[str] = frozenset()  # --conformance-ops: the operations a run is narrowed to (empty: all)
