"""Typed options: what a backend reads from the user's settings, parsed once, checked, frozen.

A compiler does not read keys of the settings dict (``tile.settings.KNOWN``, the names a user may
write) through its code: its ``build`` parses them once into its own frozen dataclass
(``LlvmOptions``, ``OpenclOptions``, ``CudaOptions``; ``CommonOptions`` holds those every target
reads), and a value of the wrong type is a ``TileSettingsError`` naming the setting, the backend and
the settings it reads. A setting another backend reads is left to that backend (one settings dict
may go to several targets); a name no part of Tile reads is refused.

What the driver knows and the user did not set (the hardware model's matrix units and caches, the
buffers' storage types) is not a setting: it reaches a compiler as ``BuildFacts``, the ``facts``
argument of ``Compiler.build`` (``build_library`` passes it to compilers that take it).
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from tile.settings import KNOWN, TileSettingsError

EMPTY: Mapping = MappingProxyType({})


# ------------------------------------------------------------------------------ kinds of value
def _flag(value: Any) -> bool | None:
    """A yes/no setting: a bool (numpy's too) or the integers 0 and 1; None if it is neither."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    return None


def _count(value: Any) -> int | None:
    """A whole-number setting (not a bool: ``threads=True`` is a mistake); None if it is not one."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    return int(value) if isinstance(value, numbers.Integral) else None


def _sizes(value: Any) -> tuple[tuple[str, int], ...] | None:
    """A mapping of memory names to byte counts (``cache_bytes``), as sorted pairs (hashable);
    None if it is not one."""
    if not isinstance(value, Mapping):
        return None
    if not all(isinstance(k, str) and _count(v) is not None for k, v in value.items()):
        return None
    return tuple(sorted((k, int(v)) for k, v in value.items()))


KINDS = {  # kind -> (convert or None, what the user must write)
    "any": (lambda value: value, ""),  # checked where it is used (``config``, ``precision``)
    "flag": (_flag, "True or False"),
    "count": (_count, "an integer"),
    "sizes": (_sizes, "a dict of memory names to byte counts, such as {'L1': 32768, 'L2': 1048576}"),
}


def setting(default: Any, kind: str, name: str | None = None) -> Any:
    """A dataclass field read from the setting ``name`` (default: the field's own name; ``kind``: a
    key of ``KINDS``)."""
    return field(default=default, metadata={"kind": kind, "name": name})


def _setting_name(f: dataclasses.Field) -> str:
    return f.metadata.get("name") or f.name


# ------------------------------------------------------------------------------ the option classes
_FIELDS: dict[type, dict[str, dataclasses.Field]] = {}  # class -> its fields by setting name
@dataclass(frozen=True)
class Options:
    """Base of the option classes: ``parse`` builds one from a settings mapping."""

    backend: ClassVar[str] = "every"
    who: ClassVar[str] = "every target"  # as messages name it

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(_setting_name(f) for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, settings: Mapping | None) -> Options:
        """The options ``settings`` gives: each of this class's settings that is present and not
        None, checked and converted; absent ones take the field's default. A name no part of Tile
        reads, or a value of the wrong kind, is a ``TileSettingsError``."""
        settings = settings or {}
        if not isinstance(settings, Mapping):
            raise TileSettingsError(f"settings must be a dict, not {type(settings).__name__}", None,
                                    cls._valid())
        if not settings:
            return cls()
        given = {}
        fields = _FIELDS.get(cls)
        if fields is None:
            fields = _FIELDS[cls] = {_setting_name(f): f for f in dataclasses.fields(cls)}
        for name, value in settings.items():
            f = fields.get(name)
            if f is None:
                if name not in KNOWN:
                    raise TileSettingsError(f"unknown setting {name!r} for {cls.who}", None, cls._valid())
                continue  # another backend's, or the driver's
            if value is None:
                continue
            convert, want = KINDS[f.metadata["kind"]]
            got = convert(value)
            if got is None:
                raise TileSettingsError(
                    f"setting {name!r} of {cls.who} must be {want}, "
                    f"not {type(value).__name__} {value!r}"[:300],
                    None, cls._valid(),
                )
            given[f.name] = got
        return cls(**given)

    @classmethod
    def _valid(cls) -> str:
        return f"{cls.who} reads: " + ", ".join(sorted(cls.names()))


@dataclass(frozen=True)
class CommonOptions(Options):
    """What every target reads (``tile.api``, ``backends.driver``, ``runner``, ``tune``); ``config``
    and ``precision`` are checked where they are loaded (``stripe.config``, ``tile.settings``)."""

    backend: ClassVar[str] = "every"
    cache: bool = setting(True, "flag")
    config: Any = setting(None, "any")  # a built-in config's name, a file or a loaded TargetConfig
    precision: str | None = setting(None, "any")
    strict: bool = setting(False, "flag")
    optimize: bool = setting(True, "flag")
    tiled: bool = setting(True, "flag")
    resident_outputs: bool = setting(False, "flag")
    tune: bool = setting(False, "flag")
    tune_candidates: int = setting(4, "count")
    tune_refresh: bool = setting(False, "flag")
    max_buffer_bytes: int | None = setting(None, "count")
    max_total_bytes: int | None = setting(None, "count")


@dataclass(frozen=True)
class LlvmOptions(Options):
    """The LLVM CPU backend's (``backends.llvm.device``; each setting's meaning: ``tile.settings``)."""

    backend: ClassVar[str] = "llvm"
    who: ClassVar[str] = "the llvm backend"
    cache: bool = setting(True, "flag")
    strict: bool = setting(False, "flag")
    threads: int | None = setting(None, "count")  # None: the pool's size
    opt: int | None = setting(None, "count")  # None: ``opt_level``'s choice
    unroll: bool | None = setting(None, "flag")  # None: at opt 2 and above
    generic: bool = setting(False, "flag")
    generic_products: bool = setting(False, "flag")  # backends.llvm.generic: products as plain loops
    reorder: bool = setting(True, "flag")
    parallel: bool = setting(True, "flag")
    inline: bool = setting(True, "flag")
    min_parallel_points: int = setting(1 << 14, "count")
    microkernel: bool = setting(True, "flag")
    panel_split: bool = setting(True, "flag")
    cache_blocks: bool = setting(True, "flag")
    sum_block: int = setting(4096, "count")
    cache_bytes: tuple | None = setting(None, "sizes")  # None: the config's (``BuildFacts``), else the host's
    soft_half: bool = setting(False, "flag")


@dataclass(frozen=True)
class OpenclOptions(Options):
    """The OpenCL backend's (``backends.opencl.compiler``)."""

    backend: ClassVar[str] = "opencl"
    who: ClassVar[str] = "the opencl backend"
    cache: bool = setting(True, "flag")
    strict: bool = setting(False, "flag")
    tiled: bool = setting(True, "flag")
    fast_math: bool = setting(False, "flag")
    local_size: int = setting(64, "count")
    async_: bool = setting(True, "flag", "async")  # (a Python keyword)
    generic: bool = setting(False, "flag")  # backends.clike.generic


@dataclass(frozen=True)
class CudaOptions(Options):
    """The CUDA backend's (``backends.cuda.compiler``)."""

    backend: ClassVar[str] = "cuda"
    who: ClassVar[str] = "the cuda backend"
    cache: bool = setting(True, "flag")
    strict: bool = setting(False, "flag")
    tiled: bool = setting(True, "flag")
    fast_math: bool = setting(False, "flag")
    local_size: int = setting(128, "count")
    generic: bool = setting(False, "flag")  # backends.clike.generic


# ------------------------------------------------------------------------------ the driver's facts
@dataclass(frozen=True)
class BuildFacts:
    """What the driver tells a compiler that is no user's setting: the hardware model's matrix units
    (for tensorized kernels), its ``L1``/``L2`` sizes (the CPU micro-kernel's cache blocks), and the
    buffers' storage types by name (for kernels whose ``KernelInfo.buffer_dtypes`` is empty)."""

    matrix_units: Mapping[str, Any] = field(default_factory=lambda: EMPTY, hash=False)
    cache_bytes: Mapping[str, int] = field(default_factory=lambda: EMPTY, hash=False)
    buffer_dtypes: Mapping[str, Any] = field(default_factory=lambda: EMPTY, hash=False)

    @classmethod
    def of(cls, config) -> BuildFacts:
        """The facts of an optimizer config (``stripe.config.TargetConfig``; None: none)."""
        if config is None:
            return NO_FACTS
        hw = config.hardware
        caches = {n: hw.mem_bytes(n) for n in ("L1", "L2") if n in hw.mem_units}
        return cls(matrix_units=MappingProxyType(dict(hw.matrix_units or {})),
                   cache_bytes=MappingProxyType(caches))


NO_FACTS = BuildFacts()

_TAKES_FACTS: dict[type, bool] = {}


def takes_facts(compiler) -> bool:
    """Whether ``compiler.build`` has a ``facts`` parameter (a plugin's written to the older
    ``build(kernels, settings)`` has not, and is called without them)."""
    kind = type(compiler)
    got = _TAKES_FACTS.get(kind)
    if got is None:
        try:
            got = "facts" in inspect.signature(compiler.build).parameters
        except (TypeError, ValueError):
            got = False
        _TAKES_FACTS[kind] = got
    return got


def build_library(compiler, kernels, settings: Mapping, facts: BuildFacts = NO_FACTS):
    """``compiler.build`` on ``kernels`` with the user's ``settings`` and the driver's ``facts``."""
    if takes_facts(compiler):
        return compiler.build(kernels, settings, facts=facts)
    return compiler.build(kernels, settings)


__all__ = ["NO_FACTS", "BuildFacts", "CommonOptions", "CudaOptions", "LlvmOptions", "OpenclOptions",
           "Options", "build_library", "takes_facts"]
