"""Device enumeration: every available target, by a stable id like ``llvm_cpu.0``.

Devices come from the entry point group ``tile.devices``: each entry point names a callable that
takes no arguments and returns an iterable of devices (``backends.hal.Device``, or
``backends.program.ProgramDevice`` for a whole-program target). Tile's own llvm and OpenCL
devices register there in ``pyproject.toml`` like any other package's. ``interp`` (the reference
interpreter) is always there and is no device; ``external:COMMAND`` names a backend in another
process, started on first use (``backends.external``).

A plugin that fails to import, raises, returns something that is not a device, or repeats an id
breaks nothing else: ``unavailable()`` says, per entry point, which package it came from and why
(``python -m tile devices`` lists it). ``get`` loads first the entry points whose name begins the
asked-for id (``llvm_cpu`` for ``llvm_cpu.0``), so compiling for one device does not probe every
other; an id no such entry point gives loads them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module, metadata

from backends.hal import Device, ProgramDevice
from tile.errors import TileDeviceError

GROUP = "tile.devices"
EXTERNAL = "external:"
# The built-in entry points as pyproject.toml declares them: used only where the installed
# metadata lacks them (a source checkout run without `pip install -e .`, or an install older
# than the group). tests/test_registry.py checks that the two agree.
BUILTIN = {
    "cuda": "backends.cuda.device:devices",
    "llvm_cpu": "backends.llvm:devices",
    "opencl": "backends.opencl:devices",
    "plaidml": "backends.plaidml:devices",
}

# Ids a factory makes on demand, never listed by ``devices()``: prefix -> "module:callable" that
# takes the whole id and returns a device (or raises TileDeviceError). ``mutant:NAME`` are the
# conformance suite's seeded defects (conformance/mutants), named by string as entry points are.
FACTORIES = {"mutant:": "conformance.mutants:device"}

_devices: dict[str, Device | ProgramDevice] = {}
_made: dict[str, Device | ProgramDevice] = {}
_why_not: dict[str, str] = {}  # entry point (or device id) -> why it gives no device
_loaded: set[str] = set()  # entry point names already loaded
_external: dict[str, ProgramDevice] = {}
_all_loaded = False  # every entry point loaded (reading the installed metadata costs ~3 ms a time)


def entry_points() -> list[metadata.EntryPoint]:
    """The ``tile.devices`` entry points, the built-in ones first (a plugin cannot shadow them)."""
    found = list(metadata.entry_points(group=GROUP))
    names = {ep.name for ep in found}
    for name, value in BUILTIN.items():
        if name not in names:
            found.append(metadata.EntryPoint(name, value, GROUP))
    return sorted(found, key=lambda ep: (ep.name not in BUILTIN, ep.name))


def package(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "tile (built in)"


def _load(ep: metadata.EntryPoint) -> None:
    """Add the devices of one entry point; a misbehaving plugin is recorded, never raised."""
    if ep.name in _loaded:
        return
    _loaded.add(ep.name)
    where = f"entry point '{ep.name} = {ep.value}' of {package(ep)}"
    try:
        made = ep.load()()
        if not isinstance(made, Iterable):
            raise TypeError(f"returned {type(made).__name__}, not an iterable of devices")
        devices = list(made)
    except Exception as e:  # noqa: BLE001 - a broken plugin must not take the others down
        _why_not[ep.name] = f"{where} failed: {type(e).__name__}: {e}"
        return
    why = getattr(made, "unavailable", None)  # a plugin may say why it made fewer devices
    if isinstance(why, dict):
        _why_not.update({str(k): str(v) for k, v in why.items()})
    for dev in devices:
        if not isinstance(dev, (Device, ProgramDevice)):
            _why_not[f"{ep.name}:{type(dev).__name__}"] = (
                f"{where} returned a {type(dev).__name__}, not a backends.hal.Device"
            )
            continue
        dev_id = getattr(dev, "id", None)
        if not isinstance(dev_id, str) or not dev_id or dev_id == "interp" or dev_id.startswith(EXTERNAL):
            _why_not[f"{ep.name}:{dev_id!r}"] = f"{where} returned a device with the unusable id {dev_id!r}"
        elif dev_id in _devices:
            _why_not[f"{dev_id} ({ep.name})"] = (
                f"{where} repeats the id '{dev_id}', which another entry point gave"
            )
        else:
            _devices[dev_id] = dev


def _load_all() -> None:
    global _all_loaded
    if not _all_loaded:
        for ep in entry_points():
            _load(ep)
        _all_loaded = True


def devices() -> dict[str, Device | ProgramDevice]:
    """Every available device by id, from every entry point (the interpreter is not a device:
    see ``ids``)."""
    _load_all()
    return _devices


def ids() -> list[str]:
    """Every target id usable with ``tile.compile`` and ``--target``: ``interp`` and the devices."""
    return ["interp", *devices()]


def get(device_id: str) -> Device | ProgramDevice:
    """The device ``device_id`` names, or a ``TileDeviceError`` that lists the available ids."""
    if device_id.startswith(EXTERNAL):
        return external(device_id)
    factory = next((f for p, f in FACTORIES.items() if device_id.startswith(p)), None)
    if factory is not None:
        if device_id not in _made:
            module, _, name = factory.partition(":")
            _made[device_id] = getattr(import_module(module), name)(device_id)
        return _made[device_id]
    if device_id not in _devices:
        for ep in entry_points():
            if device_id.startswith(ep.name):
                _load(ep)
    if device_id not in _devices:
        _load_all()
    if device_id not in _devices:
        why = next((f" ({w})" for k, w in _why_not.items() if device_id.startswith(k.split(":")[0])), "")
        raise TileDeviceError(
            f"no device '{device_id}'{why}; available: {', '.join(ids())}",
            None,
            hint="pick an id from `python -m tile devices`, or 'external:COMMAND' for a backend "
            "in another process",
        )
    return _devices[device_id]


def external(device_id: str) -> ProgramDevice:
    """The external backend ``external:COMMAND`` (one per command, started on first use)."""
    dev = _external.get(device_id)
    if dev is None:
        from backends.external import ExternalDevice

        command = device_id[len(EXTERNAL) :].strip()
        if not command:
            raise TileDeviceError(
                "'external:' names no command",
                None,
                hint="write external:COMMAND, e.g. 'external:./my_backend'",
            )
        dev = _external[device_id] = ExternalDevice(command, device_id)
    return dev


def unavailable() -> dict[str, str]:
    """Why entry points or devices gave nothing: ``{name: reason}`` (the package is named)."""
    _load_all()
    return dict(_why_not)


def reset() -> None:
    """Forget every loaded device (tests that install a plugin, then look again)."""
    global _all_loaded
    for dev in _external.values():
        dev.close()
    _devices.clear()
    _why_not.clear()
    _loaded.clear()
    _external.clear()
    _made.clear()
    _all_loaded = False
