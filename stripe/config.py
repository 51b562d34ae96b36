"""Target configs: a hardware model and an ordered pass list, read from JSON.

A target is a file, not a fork (``stripe/targets/<name>.json`` ships the built-in ones)::

    {
      "name": "llvm_cpu",
      "description": "...",      (optional: what the target is)
      "device": "llvm_cpu.0",    (optional: the device it is for)
      "capabilities": {"operations": ["add", "agg_sum"], "dtypes": ["float32"],
                       "max_rank": 4, "tolerance": "standard"},   (optional: tile.capabilities)
      "hardware": {"clock_mhz": 3000,
                   "mem_units": {"DRAM": {"size_KiB": 16777216}, "L2": {"size_KiB": 1024}},
                   "exec_units": {"CPU": {"count": 2, "ops_per_cycle": 16}},
                   "tx_units": {}, "buses": []},
      "passes": [
        {"name": "tile_contractions", "pass": "autotile",
         "params": {"reqs": ["contraction"], "memory": "L2"}}
      ]
    }

Every ``params`` object is checked against the pass's config dataclass (``stripe.passes``): an
unknown pass or key, a missing field or a wrong type is a ``ConfigError`` pointing at the place
in the file, with the fix; so is a value the config class refuses (its ``invalid()``, if it has one,
names the key). The hardware model's sizes, counts, thread counts and rates must be greater than
0 (``_POSITIVE``), its numbers finite. ``target_config("llvm_cpu.0")`` loads the built-in config of a device
id's kind; ``load_config(path)`` a user's file.

A config may say only how it differs from another: ``"extends"`` names its base, a built-in
config's name (``"opencl_gpu"``) or a file's path (ending in ``.json`` or holding a ``/``;
relative to the folder of the file that names it)::

    {
      "extends": "opencl_gpu",
      "name": "my_cpu",
      "hardware": {"clock_mhz": 3000, "exec_units": {"GPU": null, "CPU": {"count": 8}}},
      "remove": ["split_reductions"],
      "replace": {"tile_gemms": {"pass": "gemm_tile", "params": {"reqs": ["kernel"]}}},
      "params": {"row_programs": {"group": 64}, "fuse_eltwise": {"a_skip": null}},
      "add": [{"after": "fuse_eltwise", "steps": [{"name": "split", "pass": ..., "params": ...}]},
              {"before": "row_programs", "steps": [...]},
              {"steps": [...]}]
    }

* ``name``, ``description``, ``device`` and ``hardware`` are merged over the base's as a JSON
  merge patch (RFC 7396): an object merges key by key, ``null`` deletes a key (a memory, a unit,
  a field back to its default), any other value (a number, a list such as ``buses``) replaces.
  What the file does not give is the base's.
* The pass list is the base's, edited by step name in this order, whatever the order of the
  keys: ``remove`` steps; ``replace`` whole steps (a replacement's ``"name"`` may be left out: it
  keeps the replaced step's); patch the ``params`` of steps (a merge patch as above: ``null``
  gives a param back its default); ``add`` runs of new steps, each ``after`` a step, ``before``
  one or (naming neither) at the end, in the order listed, so an addition may name a step an
  earlier one added. Or ``"passes"`` gives the whole list instead (not together with edits).
* Bases chain. Each file is read on its own and a mistake is reported in the file that has it: a
  cycle of bases, an unknown base, a step the base does not have, an added (or renamed) step whose
  name the list already has are located errors. Resolution happens at load time: the result is a
  plain ``TargetConfig``.
* ``"pass_modules"``: modules imported before the file's steps are checked, whose import
  registers passes ``stripe.passes`` does not define (a vendor's package's); a base's count too.

Three built-in configs are complete files (``accel``, ``llvm_cpu``, ``gpu``: tests and users copy
them as the example of the whole format); the others are deltas over them by name
(``llvm_cpu_tiled``; ``opencl_cpu`` and NVIDIA's ``cuda`` over ``gpu``; ``opencl_gpu`` over
``cuda``, ``opencl_gpu_tiled`` over that), so a copy of one still loads from anywhere.
``format_config(cfg)`` writes a config out fully resolved, every step with all its params, so that
``parse_config(format_config(cfg), cfg.source) == cfg``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from stripe.config_types import ConfigError, PassSpec, TargetConfig
from stripe.hardware import (
    Bus,
    ExecUnit,
    Fragment,
    Hardware,
    MatrixUnit,
    MemUnit,
    MmaShape,
    TxUnit,
    WarpGroup,
)
from stripe.jsonpos import KEY, positions
from stripe.passes import PASSES
from tile.capabilities import Declared
from tile.errors import Source, Span

__all__ = [
    "TARGETS", "ConfigError", "PassSpec", "TargetConfig", "builtin_names", "error_at", "format_config",
    "load_config", "parse_config", "pass_params", "resolve_config", "target_config",
]

TARGETS = Path(__file__).parent / "targets"

_TOP = ("name", "description", "device", "hardware", "capabilities")  # merged over the base's
_EDITS = ("remove", "replace", "params", "add")  # applied in this order
_KEYS = {"extends", *_TOP, "passes", *_EDITS, "pass_modules"}
_REQUIRED = ("hardware", "name", "passes")


def builtin_names() -> list[str]:
    return sorted(p.stem for p in TARGETS.glob("*.json"))


def target_config(target: str) -> TargetConfig:
    """The built-in config for a target id (``llvm_cpu.0`` → ``llvm_cpu``) or config name."""
    kind = target.split(".", 1)[0]
    if kind not in builtin_names():
        names = ", ".join(builtin_names())
        raise ConfigError(
            f"no built-in optimizer config for target '{target}'",
            None,
            f"the built-in configs are {names}; or give your own file (--config F.json)",
        )
    return load_config(TARGETS / f"{kind}.json")


def resolve_config(given) -> TargetConfig | None:
    """A config as settings and devices name one: a loaded ``TargetConfig`` (the autotuner's trial
    configs), the name of a built-in config, or a config file's path; None for none."""
    if not given:
        return None
    if isinstance(given, TargetConfig):
        return given
    if isinstance(given, str) and given in builtin_names():
        return target_config(given)
    return load_config(given)


def load_config(path: str | Path) -> TargetConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        hint = f"check the path; the built-in configs are named {', '.join(builtin_names())}"
        raise ConfigError(f"cannot read config file '{path}': {e.strerror}", None, hint) from None
    return parse_config(text, str(path))


def parse_config(text: str, name: str = "<string>") -> TargetConfig:
    """A config from its text; ``name`` is the file it is reported under, and the folder a
    relative ``"extends"`` path starts from."""
    return _resolve(text, name, ()).config(name)


def error_at(source: str, path: tuple, message: str, hint: str) -> ConfigError:
    """A ``ConfigError`` pointing at ``path`` (``("device",)``) in the config file ``source``, for a
    mistake only its caller can see (the conformance suite: a device id no backend registers);
    at the nearest enclosing value the file writes (a base's value: at the file's top)."""
    try:
        text = Path(source).read_text()
        reader = _Reader(Source(text, source), positions(text))
    except (OSError, ValueError, AttributeError, IndexError):  # gone or changed since it was loaded
        return ConfigError(f"{source}: {_fmt(path)}: {message}", None, hint)
    return reader.error(path, message, hint)


def pass_params(pass_name: str, params: dict) -> object:
    """A registered pass's config from a plain dict (tests and the API), checked like a file's."""
    text = json.dumps({"name": "params", "pass": pass_name, "params": params}, indent=1)
    step = _Reader(Source(text, "<params>"), positions(text)).step(json.loads(text), ())
    return _spec(step).params


def format_config(cfg: TargetConfig) -> str:
    """The config fully resolved, as JSON text in the file format without ``"extends"``: the
    hardware and every step with all its params, defaults included (what ``python -m tile emit
    --stage config`` shows). ``parse_config`` of it gives ``cfg`` back."""
    data: dict = {"name": cfg.name}
    if cfg.description:
        data["description"] = cfg.description
    if cfg.device:
        data["device"] = cfg.device
    if cfg.pass_modules:
        data["pass_modules"] = list(cfg.pass_modules)
    data["hardware"] = _plain(cfg.hardware)
    if cfg.capabilities is not None:
        data["capabilities"] = cfg.capabilities.to_json()
    data["passes"] = [{"name": s.name, "pass": s.pass_, "params": _plain(s.params)} for s in cfg.passes]
    return _dump(data, 0, 0) + "\n"


# ------------------------------------------------------------------------------ resolution
Where = tuple  # (a file's _Reader, a path in that file): where a part of a config was written


class _Tree:
    """A JSON value put together from several files. ``origins`` maps a path in the value to
    where that part was written; a path's longest prefix there names its file."""

    def __init__(self, value, where: Where):
        self.value = value
        self.origins: dict[tuple, Where] = {(): where}

    def patch(self, patch, where: Where, key: str | None = None) -> None:
        """Merges ``patch`` (RFC 7396) over the value, or over its member ``key``."""
        if key is None:
            self.value = self._merge(self.value, patch, (), where)
        else:
            self.value = {**self.value, key: self._merge(self.value.get(key), patch, (key,), where)}

    def _merge(self, target, patch, rel: tuple, where: Where):
        if not isinstance(patch, dict):
            self._set(rel, where)
            return patch
        if not isinstance(target, dict):
            self._set(rel, where)
            target = {}
        out = dict(target)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
                self._drop(rel + (k,))
            else:
                out[k] = self._merge(out.get(k), v, rel + (k,), (where[0], where[1] + (k,)))
        return out

    def _set(self, rel: tuple, where: Where) -> None:
        self._drop(rel)
        self.origins[rel] = where

    def _drop(self, rel: tuple) -> None:
        for p in [p for p in self.origins if p[: len(rel)] == rel and p]:
            del self.origins[p]


@dataclass
class _Raw:
    """A config file read and resolved against its bases, not yet checked against the passes."""

    top: _Tree  # name, description, device, hardware
    steps: list[_Tree] | None  # each {"name", "pass", "params"}; None: no file gave passes
    leaf: _Reader  # the file being loaded
    extends: bool
    modules: tuple[str, ...] = ()  # "pass_modules" of the file and its bases, imported

    def config(self, source: str) -> TargetConfig:
        self.top.origins[()] = (self.leaf, ())
        for k in _REQUIRED:
            missing = self.steps is None if k == "passes" else k not in self.top.value
            if missing:
                hint = f'add "{k}"' + (" (here or in a config it extends)" if self.extends else "")
                raise self.leaf.error((), f"a config lacks the key '{k}'", hint)
        view, top = _View(self.top.origins), self.top.value
        name = view.convert(top["name"], str, ("name",))
        description = view.convert(top.get("description", ""), str, ("description",))
        device = view.convert(top.get("device", ""), str, ("device",))
        hardware = view.convert(top["hardware"], Hardware, ("hardware",))
        caps = view.convert(top.get("capabilities"), Declared | None, ("capabilities",), "'capabilities'")
        specs = tuple(_spec(s) for s in self.steps)
        return TargetConfig(name, hardware, specs, source, device, description, caps, self.modules)


def _resolve(text: str, name: str, chain: tuple[str, ...]) -> _Raw:
    """``chain``: the files that extend this one, outermost first (to find a cycle)."""
    src = Source(text, name)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        span = Span(e.lineno, e.colno, 1, src)
        raise ConfigError(f"not valid JSON: {e.msg}", span, "fix the JSON syntax") from None
    reader = _Reader(src, positions(text))
    if not isinstance(data, dict):
        hint = 'write {"name": ..., "hardware": ..., "passes": [...]}'
        raise reader.error((), "a config is a JSON object", hint)
    reader.keys(data, (), _KEYS, set(), "a config")
    own = _pass_modules(reader, data.get("pass_modules", []))
    edits = [k for k in _EDITS if k in data]
    if "extends" in data:
        raw = _base(reader, data["extends"], chain + (name,))
        raw.leaf, raw.extends = reader, True
    elif edits:
        hint = 'name the config it edits ("extends": NAME or PATH), or write the list in "passes"'
        message = f"'{edits[0]}' edits the passes of a base, and there is none"
        raise reader.error((edits[0], KEY), message, hint)
    else:
        raw = _Raw(_Tree({}, (reader, ())), None, reader, False)
    raw.top.patch({k: data[k] for k in _TOP if k in data}, (reader, ()))
    raw.modules = tuple(dict.fromkeys(raw.modules + own))
    if "passes" in data and edits:
        hint = f'drop "{edits[0]}" and list every step, or drop "passes" and edit the base\'s steps'
        message = "a config gives its whole pass list or edits its base's, not both"
        raise reader.error((edits[0], KEY), message, hint)
    if "passes" in data:
        raw.steps = []
        for k, obj in enumerate(reader.convert(data["passes"], list, ("passes",))):
            raw.steps.append(reader.step(obj, ("passes", k)))
    elif edits:
        raw.steps = raw.steps or []
        reader.edit(data, raw.steps)
    return raw


def _pass_modules(reader: _Reader, given) -> tuple[str, ...]:
    """The modules a file names in ``"pass_modules"``, imported: a target package's own passes
    register themselves (``stripe.passes.register``) when their module is imported, before the
    file's steps are checked against the registered passes."""
    names = []
    for k, name in enumerate(reader.convert(given, list, ("pass_modules",))):
        name = reader.convert(name, str, ("pass_modules", k))
        try:
            importlib.import_module(name)
        except ImportError as e:
            hint = "name a module on the Python path whose import registers passes (stripe.passes.register)"
            message = f"cannot import the pass module '{name}' ({e})"
            raise reader.error(("pass_modules", k), message, hint) from None
        names.append(name)
    return tuple(names)


def _base(reader: _Reader, given, chain: tuple[str, ...]) -> _Raw:
    """The config ``"extends"`` names, resolved."""
    at = ("extends",)
    ref = reader.convert(given, str, at)
    if ref.endswith(".json") or "/" in ref:
        path = Path(ref) if Path(ref).is_absolute() else Path(reader.src.name).parent / ref
    elif ref in builtin_names():
        path = TARGETS / f"{ref}.json"
    else:
        hint = f"the built-in configs are {', '.join(builtin_names())}; a file's path ends in .json"
        raise reader.error(at, f"no built-in config named '{ref}'", hint)
    seen = [str(Path(c).resolve()) for c in chain]
    if str(path.resolve()) in seen:
        loop = " -> ".join([*chain[seen.index(str(path.resolve())):], str(path)])
        hint = 'a config cannot extend itself, directly or through its bases: remove one "extends"'
        raise reader.error(at, f"the bases form a cycle: {loop}", hint)
    try:
        text = path.read_text()
    except OSError as e:
        hint = "a relative path starts at the folder of this file"
        raise reader.error(at, f"cannot read the base config '{path}': {e.strerror}", hint) from None
    return _resolve(text, str(path), chain)


def _spec(step: _Tree) -> PassSpec:
    kind, view = step.value["pass"], _View(step.origins)
    what = f"the params of pass '{kind}'"
    params = view.convert(step.value["params"], PASSES[kind].config, ("params",), what)
    return PassSpec(step.value["name"], kind, params)


# ------------------------------------------------------------------------------ reading
# The hardware model's fields that must be greater than 0 (the types check integer or number):
# a memory of -4 KiB, a unit with no threads or a bus moving no bytes would make the passes and
# the cost model divide by, or tile to, nothing.
_POSITIVE: dict[type, tuple[str, ...]] = {
    Hardware: ("clock_mhz",),
    MemUnit: ("size_KiB", "count", "line_bytes"),
    ExecUnit: ("count", "ops_per_cycle", "pipeline_depth", "threads"),
    TxUnit: ("count",),
    Bus: ("bytes_per_cycle",),
    MatrixUnit: ("lanes", "group"),
    MmaShape: ("m", "n", "k"),
    Fragment: ("per_register",),
    WarpGroup: ("k_bytes",),
}
class _Reader:
    """Checks the values of one config file, reporting mistakes at their place in it."""

    def __init__(self, src: Source, pos: dict):
        self.src = src
        self.pos = pos

    def locate(self, path: tuple) -> tuple[_Reader, tuple]:
        """The file a path's value was written in, and its path there."""
        return self, path

    def span(self, path: tuple) -> Span | None:
        while path not in self.pos and path:
            path = path[:-1]
        p = self.pos.get(path)
        return Span(p[0], p[1], p[2], self.src) if p else None

    def error(self, path: tuple, message: str, hint: str) -> ConfigError:
        reader, path = self.locate(path)
        return ConfigError(f"{_fmt(path)}: {message}" if path else message, reader.span(path), hint)

    def keys(self, obj: dict, path: tuple, allowed: set[str], required: set[str], what: str) -> None:
        for k in obj:
            if k not in allowed:
                known = ", ".join(sorted(allowed)) or "none"
                raise self.error(path + (k, KEY), f"unknown key '{k}' in {what}", f"the keys are: {known}")
        for k in sorted(required):
            if k not in obj:
                raise self.error(path, f"{what} lacks the key '{k}'", f"add \"{k}\"")

    def step(self, obj, path: tuple, name: str | None = None) -> _Tree:
        """A pass step (its params are checked once the config is resolved); ``name``: the name
        of the step it replaces, which it keeps unless it gives its own."""
        if not isinstance(obj, dict):
            raise self.error(path, "a pass is an object", 'write {"name": ..., "pass": ..., "params": {...}}')
        self.keys(obj, path, {"name", "pass", "params"}, {"pass"} if name else {"name", "pass"}, "a pass")
        step = self.convert(obj.get("name", name), str, path + ("name",))
        kind = self.convert(obj["pass"], str, path + ("pass",))
        if kind not in PASSES:
            known = ", ".join(sorted(PASSES))
            raise self.error(path + ("pass",), f"unknown pass '{kind}'", f"the passes are: {known}")
        return _Tree({"name": step, "pass": kind, "params": obj.get("params", {})}, (self, path))

    def unique(self, steps: list[_Tree], i: int, path: tuple) -> None:
        name = steps[i].value["name"]
        if any(s.value["name"] == name for j, s in enumerate(steps) if j != i):
            hint = "step names are unique (--after NAME stops at one): rename it, or replace the other"
            raise self.error(path + ("name",), f"there already is a step named '{name}'", hint)

    def edit(self, data: dict, steps: list[_Tree]) -> None:
        """Applies the file's edits to its base's steps, in the order of ``_EDITS``."""

        removed: set[str] = set()

        def find(name, path: tuple) -> int:
            name = self.convert(name, str, path)
            for i, s in enumerate(steps):
                if s.value["name"] == name:
                    return i
            have = ", ".join(s.value["name"] for s in steps) or "none"
            message = f"the config it extends has no step named '{name}'"
            if name in removed:
                message = f"the step '{name}' is removed (\"remove\" applies first)"
            raise self.error(path, message, f"its steps are: {have}")

        for k, name in enumerate(self.convert(data.get("remove", []), list, ("remove",))):
            removed.add(steps.pop(find(name, ("remove", k))).value["name"])
        for name, obj in self.convert(data.get("replace", {}), dict, ("replace",)).items():
            i = find(name, ("replace", name, KEY))
            steps[i] = self.step(obj, ("replace", name), name)
            self.unique(steps, i, ("replace", name))
        for name, patch in self.convert(data.get("params", {}), dict, ("params",)).items():
            i = find(name, ("params", name, KEY))
            if not isinstance(patch, dict):
                hint = 'write {"PARAM": value, ...}: the params to change (null: back to the default)'
                raise self.error(("params", name), f"expected an object, got {_kind(patch)}", hint)
            steps[i].patch(patch, (self, ("params", name)), "params")
        for k, add in enumerate(self.convert(data.get("add", []), list, ("add",))):
            at = ("add", k)
            if not isinstance(add, dict):
                hint = 'write {"after": STEP, "steps": [...]} ("before": STEP, or neither: at the end)'
                raise self.error(at, f"expected an object, got {_kind(add)}", hint)
            self.keys(add, at, {"after", "before", "steps"}, {"steps"}, "an addition")
            if "after" in add and "before" in add:
                hint = 'keep "after" or "before"'
                raise self.error(at + ("before", KEY), "an addition goes after a step or before one", hint)
            i = len(steps)
            if "after" in add:
                i = find(add["after"], at + ("after",)) + 1
            elif "before" in add:
                i = find(add["before"], at + ("before",))
            for j, obj in enumerate(self.convert(add["steps"], list, at + ("steps",))):
                steps.insert(i + j, self.step(obj, at + ("steps", j)))
                self.unique(steps, i + j, at + ("steps", j))

    def convert(self, value, tp, path: tuple, what: str | None = None):
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            rest = [a for a in args if a is not type(None)]
            return self.convert(value, rest[0], path, what)
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                hint = f"write {{...}} ({tp.__name__})"
                raise self.error(path, f"expected an object, got {_kind(value)}", hint)
            hints = typing.get_type_hints(tp)
            fields = {f.name: f for f in dataclasses.fields(tp)}
            required = {
                n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            }
            self.keys(value, path, set(fields), required, what or f"'{_fmt(path)}'")
            obj = tp(**{k: self.convert(v, hints[k], path + (k,)) for k, v in value.items()})
            for k in _POSITIVE.get(tp, ()):
                if k in value and not getattr(obj, k) > 0:
                    raise self.error(path + (k,), f"expected a positive number, got {_kind(value[k])}",
                                     "a size, count or rate is greater than 0")
            # A config class may refuse values its types allow: ``invalid()`` gives (key, message, hint).
            bad = obj.invalid() if hasattr(obj, "invalid") else None
            if bad is not None:
                raise self.error(path + (bad[0],), bad[1], bad[2])
            return obj
        if origin is tuple or tp is tuple or origin is list or tp is list:
            if not isinstance(value, list):
                raise self.error(path, f"expected a list, got {_kind(value)}", "write [...]")
            item = args[0] if args else typing.Any
            items = [self.convert(v, item, path + (k,)) for k, v in enumerate(value)]
            return items if (origin is list or tp is list) else tuple(items)
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                raise self.error(path, f"expected an object, got {_kind(value)}", "write {...}")
            item = args[1] if args else typing.Any
            return {k: self.convert(v, item, path + (k,)) for k, v in value.items()}
        if tp is typing.Any:
            return value
        if tp is bool:
            if not isinstance(value, bool):
                raise self.error(path, f"expected true or false, got {_kind(value)}", "write true or false")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(path, f"expected an integer, got {_kind(value)}", "write a whole number")
            return value
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.error(path, f"expected a number, got {_kind(value)}", "write a number")
            if not math.isfinite(value):
                raise self.error(path, f"expected a finite number, got {_kind(value)}", "write a number")
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise self.error(path, f"expected a string, got {_kind(value)}", 'write "..."')
            return value
        raise AssertionError(f"config type {tp!r} is not supported")  # our bug: a pass config's type


class _View(_Reader):
    """Reads a value put together from several files (a ``_Tree``): each mistake is reported in
    the file that wrote the part it is in."""

    def __init__(self, origins: dict[tuple, Where]):
        self.origins = origins

    def locate(self, path: tuple) -> tuple[_Reader, tuple]:
        for n in range(len(path), -1, -1):
            where = self.origins.get(path[:n])
            if where is not None:
                return where[0], where[1] + path[n:]
        raise AssertionError("a tree always has the origin of its root")


# ------------------------------------------------------------------------------ writing
def _plain(value):
    """A config dataclass as the JSON a file writes: every field, tuples as lists, whole floats
    as integers (a float field reads an integer back as the same float)."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _dump(value, indent: int, column: int, width: int = 100) -> str:
    """JSON text that keeps an object or a list on one line when it fits in ``width`` columns
    (starting at ``column``), else puts each member on a line of its own."""
    flat = json.dumps(value)
    if column + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            key = f"{pad}{json.dumps(k)}: "
            items.append(key + _dump(v, indent + 2, len(key)))
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _dump(v, indent + 2, len(pad)) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _fmt(path: tuple) -> str:
    out = ""
    for p in path:
        if p == KEY:
            continue
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out
