"""What ``python -m tile devices`` lists, kept on disk between runs.

Listing the devices means loading every ``tile.devices`` entry point: importing the backends
(llvmlite, pyopencl, sympy through the code generators) and building a test kernel on every OpenCL
device, a second or more, for an answer that changes only when the machine does. So the listing
(each device's id, description and capabilities, and why the others are unavailable) is stored in
the kernel cache's directory (``backends.diskcache``: ``$TILE_CACHE_DIR``, else
``~/.cache/tile/devices``; one file per Python environment) under a key of everything it depends on
that is cheap to read without loading a backend (``probe_key``): Tile's version, the entry points
and their packages, the versions of llvmlite, pyopencl and pip's PoCL, the installed OpenCL ICDs,
NVIDIA's driver version and device nodes, the CPU model and the cores this process may use, the
Python environment (the interpreter, and the distributions installed on its path: any install,
upgrade or removal), when the source files of the entry points' modules last changed, and the
environment variables the drivers and Tile read. A hit reads one file and imports no backend; a
changed key, or a file that is missing, truncated or corrupt, probes again and rewrites it.
``fresh=True`` (``tile devices --fresh``) always probes.

Only the listing is cached: ``tile.compile`` and ``registry.get`` always load the device itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path

from backends import diskcache, registry

# the packages whose versions decide what the built-in backends find
DRIVER_PACKAGES = ("llvmlite", "pyopencl", "pocl-binary-distribution", "plaidml")
# environment variables read by Tile's backends or by the drivers under them
ENV_PREFIXES = ("TILE_", "POCL_", "OCL_", "PYOPENCL_", "CUDA_", "NVIDIA_", "ROCR_", "HIP_", "ZE_")
ENV_IGNORED = ("TILE_DEBUG",)
ICD_DIR = "/etc/OpenCL/vendors"


@dataclass(frozen=True)
class Listed:
    """One device as ``tile devices`` shows it."""

    id: str
    description: str
    fp64: bool
    fp16: bool
    stage: str | None = None  # a whole-program device's input stage (``ProgramDevice.stage``)


@dataclass(frozen=True)
class Listing:
    devices: tuple[Listed, ...]
    unavailable: dict[str, str] = field(default_factory=dict)  # entry point or device -> why not
    cached: bool = False  # read from the disk cache, not probed in this process

    def ids(self) -> list[str]:
        """``interp`` and every listed device's id, as ``registry.ids()`` gives them."""
        return ["interp", *(d.id for d in self.devices)]


def listing(fresh: bool = False) -> Listing:
    """The devices and the unavailable ones: from the disk cache where its key matches (unless
    ``fresh``), else probed through ``registry`` and stored."""
    path = cache_file()
    key = diskcache.digest(probe_key(), "tile devices listing")
    if not fresh:
        raw = diskcache.read_entry(path, key)
        if raw is not None:
            try:
                return decode(raw)
            except (ValueError, TypeError, KeyError):  # a valid entry of another layout: probe
                pass
    found = probe()
    diskcache.write_entry(path, key, encode(found))
    return found


def cache_file() -> Path:
    """The listing's file: one per Python environment (its interpreter and prefix), so that two
    environments sharing the cache directory do not overwrite each other's."""
    which = hashlib.sha256(f"{sys.executable}\0{sys.prefix}".encode()).hexdigest()[:16]
    return diskcache.cache_dir("devices") / f"devices-{which}.json"


def probe() -> Listing:
    """The listing as ``registry`` finds it now (every entry point loaded)."""
    rows = []
    for dev_id, dev in registry.devices().items():
        caps = dev.capabilities
        rows.append(Listed(dev_id, str(dev.description), bool(caps.fp64), bool(caps.fp16),
                           getattr(dev, "stage", None)))
    return Listing(tuple(rows), registry.unavailable())


def encode(found: Listing) -> bytes:
    rows = [[d.id, d.description, d.fp64, d.fp16, d.stage] for d in found.devices]
    return json.dumps({"devices": rows, "unavailable": found.unavailable}, sort_keys=True).encode()


def decode(raw: bytes) -> Listing:
    data = json.loads(raw)
    rows = []
    for dev_id, description, fp64, fp16, stage in data["devices"]:
        if not (isinstance(dev_id, str) and isinstance(description, str)):
            raise TypeError("a device's id and description are strings")
        rows.append(Listed(dev_id, description, bool(fp64), bool(fp16), stage))
    why = data["unavailable"]
    if not isinstance(why, dict):
        raise TypeError("unavailable is a mapping")
    return Listing(tuple(rows), {str(k): str(v) for k, v in why.items()}, cached=True)


def probe_key() -> dict:
    """Everything the listing depends on that can be read without loading a backend."""
    points = registry.entry_points()
    return {
        "entry_points": [f"{ep.name} = {ep.value} ({registry.package(ep)})" for ep in points],
        "sources": {ep.value: _newest_source(ep.value.partition(":")[0]) for ep in points},
        "packages": {name: _version(name) for name in DRIVER_PACKAGES},
        "opencl_icds": _icds(),
        "nvidia": _read("/proc/driver/nvidia/version"),
        "device_nodes": sorted(n for n in _listdir("/dev") if n.startswith(("nvidia", "kfd", "dri"))),
        "cpu": _cpu_model(),
        "cores": [os.cpu_count(), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0],
        "host": os.uname().nodename if hasattr(os, "uname") else "",
        "python": [sys.version, sys.prefix, sys.executable],
        "installed": _installed(),
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED},
    }


def _installed() -> dict[str, list[str]]:
    """Per folder of ``sys.path``, the distributions installed there (their ``.dist-info`` and
    ``.egg-info`` folders, which carry their versions) and ``.pth`` files: any install, upgrade or
    removal changes it; other files (a working folder's own) do not."""
    marks = (".dist-info", ".egg-info", ".egg-link", ".pth")
    found = {}
    # sys.path[0] is where python was started from (the script's folder, or the working folder
    # for -c and -m): the same environment run from two folders keeps one listing
    folders = sys.path if sys.flags.safe_path else sys.path[1:]
    for folder in dict.fromkeys(folders):
        names = sorted(n for n in _listdir(folder or ".") if n.endswith(marks))
        if names:
            found[folder] = names
    return found


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _mtime(path: str | Path) -> int | None:
    try:
        return os.stat(path or ".").st_mtime_ns
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _newest_source(module: str) -> int | None:
    """The newest modification time of the source files of ``module`` (its package's folder, or
    its file), found without importing it: a checkout whose backend code changed probes again."""
    top, _, rest = module.partition(".")
    try:
        spec = util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not spec.submodule_search_locations:
        return _mtime(spec.origin) if spec.origin else None
    base = Path(next(iter(spec.submodule_search_locations)))
    where = base.joinpath(*rest.split(".")) if rest else base
    if not where.is_dir():
        return _mtime(where.with_suffix(".py"))
    times = [_mtime(Path(d) / n) for d, _, names in os.walk(where) for n in names if n.endswith(".py")]
    return max((t for t in times if t is not None), default=None)


def _icds() -> dict[str, list]:
    """The OpenCL ICD files (the folder ``OCL_ICD_VENDORS`` names, else the system's): each one's
    name, text and modification time."""
    folder = os.environ.get("OCL_ICD_VENDORS") or ICD_DIR
    if os.path.isfile(folder):
        return {folder: [_read(folder), _mtime(folder)]}
    return {n: [_read(os.path.join(folder, n)), _mtime(os.path.join(folder, n))]
            for n in sorted(_listdir(folder)) if n.endswith(".icd")}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Processor", "cpu model")):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return os.uname().machine if hasattr(os, "uname") else sys.platform
