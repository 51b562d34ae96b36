"""A disk cache of built programs, keyed before lowering: a new process that calls a program it (or
another process) built before neither lowers, optimizes nor plans its kernels again.

``backends.driver.build`` turns a bound program into the optimized Stripe program, its kernels
(``KernelInfo``) and a device library. Everything that decides that result is known once the
program is bound, so that is where the key is made (``program_key``): the program as text (it
prints back to itself), its inputs' and every size's binding (shapes, dtypes, the values of size
inputs), the device (its id, class and description, and what its compiler says decides its code:
``Compiler.cache_identity()``), the settings (a config file's contents where they name one), a
hash of the sources that lower, optimize and name kernels (``code_identity``), this format's
number and the project version. Binding and its checks still run at every first call of a shape,
so every error the program has for these inputs is still reported.

An entry holds the optimized program, the kernel list, the target config, the settings the
compiler was handed, and the compiler's ``snapshot`` of its library; ``Compiler.restore`` makes
the library again from that (the LLVM device: the object code from its own cache, no IR). Only a
compiler that has ``cache_identity``, ``snapshot`` and ``restore`` takes part; another device
builds as before. A restore that fails (its own entry missing or corrupt) falls back to the
compiler's ``build`` on the cached kernels, and the entry is written again.

Entries use ``backends.diskcache``'s checked header and atomic writes: a truncated, corrupted or
foreign entry, or one whose payload does not unpickle to this format, is a miss, rebuilt and
rewritten, never used. ``settings={"cache": False}`` bypasses this cache as it does the others.
Entries are unpickled: the cache directory is trusted as the code is (it is the user's own,
``$TILE_CACHE_DIR`` or ``~/.cache/tile``), as the object code it holds beside them is run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
from collections.abc import Mapping
from pathlib import Path

from backends import diskcache

FORMAT = 1
_ROOT = Path(__file__).resolve().parent.parent
_code_identity: str | None = None


def takes_part(device) -> bool:
    """Whether ``device``'s compiler can be cached at the program level (see the module text)."""
    compiler = getattr(device, "compiler", None)
    return all(callable(getattr(compiler, m, None)) for m in ("cache_identity", "snapshot", "restore"))


# what only makes program text, or carries it to and from frameworks: the text is in the key itself
_NOT_BUILD = ("tile/onnx/", "tile/autodiff/", "tile/ops/", "tile/torch", "tile/jax.py", "tile/bridge.py",
              "tile/cli.py", "tile/__main__.py")


def _sources() -> list[Path]:
    """The front end (but what only makes program text, ``_NOT_BUILD``), Stripe (lowering, passes,
    built-in configs) and the generic backend modules (driver, naming, HAL): what turns a bound
    program into kernels. A device's own code is in its ``cache_identity``."""
    files = [f for d in ("tile", "stripe") for f in (_ROOT / d).rglob("*") if f.suffix in (".py", ".json")]
    files = [f for f in files if not str(f.relative_to(_ROOT)).startswith(_NOT_BUILD)]
    return sorted(files + list((_ROOT / "backends").glob("*.py")))


def code_identity() -> str:
    """SHA-256 of ``_sources()``, once per process: an edited checkout never loads an old entry."""
    global _code_identity
    if _code_identity is None:
        h = hashlib.sha256()
        for f in _sources():
            try:
                data = f.read_bytes()
            except OSError:
                data = b""
            h.update(str(f.relative_to(_ROOT)).encode() + b"\0" + hashlib.sha256(data).digest())
        _code_identity = h.hexdigest()
    return _code_identity


def _setting(value):
    """A setting as key material: a loaded config as its text, anything else as JSON sees it."""
    from stripe.config import TargetConfig, format_config

    if isinstance(value, TargetConfig):
        return format_config(value)
    return repr(value)


def _config_file(name) -> str | None:
    """The SHA-256 of the config file ``settings["config"]`` names (None for a built-in name or
    none): the key changes when the file does."""
    if not isinstance(name, str) or not name:
        return None
    from stripe.config import builtin_names

    if name in builtin_names():
        return None
    try:
        return hashlib.sha256(Path(name).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def program_key(bound, device, settings: Mapping) -> str:
    """The key of ``bound`` built for ``device`` with ``settings`` (see the module text)."""
    from tile.printer import format_program

    info = {
        "format": FORMAT,
        "code": code_identity(),
        "device": [device.id, f"{type(device).__module__}.{type(device).__qualname__}",
                   getattr(device, "description", "")],
        "compiler": device.compiler.cache_identity(),
        "settings": {k: _setting(v) for k, v in settings.items() if k != "cache"},
        "config_file": _config_file(settings.get("config")),
        "inputs": [[n, str(t)] for n, t in bound.inputs],
        "constants": sorted([k, str(v)] for k, v in bound.constants.items()),
        "outputs": list(bound.outputs),
    }
    return diskcache.digest(json.loads(json.dumps(info, default=str)), format_program(bound.program))


def _path(key: str) -> Path:
    return diskcache.cache_dir("programs") / f"{key}.prog"


def load(key: str) -> dict | None:
    """The entry stored under ``key``: ``program``, ``infos``, ``config``, ``settings``,
    ``snapshot``; None when there is none, or it is not whole and of this format."""
    data = diskcache.read_entry(_path(key), key)
    if data is None:
        return None
    try:
        entry = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a payload of another shape or version: rebuilt
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    return entry


def _rebuild(cls: type, values: tuple):
    """A slots dataclass instance from its field values (``_Pickler``), without ``__init__``."""
    names = _slot_fields(cls)
    if names is None or len(names) != len(values):
        raise pickle.UnpicklingError(f"{cls.__qualname__} has other fields now")
    obj = object.__new__(cls)
    for name, value in zip(names, values):
        object.__setattr__(obj, name, value)
    return obj


_fields: dict[type, tuple[str, ...] | None] = {}


def _slot_fields(cls: type) -> tuple[str, ...] | None:
    """The fields of a dataclass whose slots are exactly its fields (the IR's nodes), else None."""
    if cls not in _fields:
        names = None
        if dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__:
            slots = {n for c in cls.__mro__ for n in c.__dict__.get("__slots__", ())}
            fields = tuple(f.name for f in dataclasses.fields(cls))
            names = fields if slots == set(fields) else None
        _fields[cls] = names
    return _fields[cls]


class _Pickler(pickle.Pickler):
    """Pickles the IR's slots dataclasses by their field values: the default path looks their
    fields up for every node (``dataclasses._dataclass_getstate``), most of a large program's time."""

    def reducer_override(self, obj):
        names = _slot_fields(type(obj))
        if names is None:
            return NotImplemented
        return _rebuild, (type(obj), tuple(getattr(obj, n) for n in names))


def store(key: str, program, infos, config, settings: Mapping, snapshot: dict) -> bool:
    """Write the entry for ``key`` (see ``load``); False where it could not be written (a
    ``CacheWarning`` says why, once per directory) or does not pickle."""
    entry = {"format": FORMAT, "program": program, "infos": list(infos), "config": config,
             "settings": dict(settings), "snapshot": snapshot}
    try:
        out = io.BytesIO()
        _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
        data = out.getvalue()
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return diskcache.write_entry(_path(key), key, data)
