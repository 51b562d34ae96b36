"""Target configs: a hardware model and an ordered pass list, read from JSON.

A target is a file, not a fork (``stripe/targets/<name>.json`` ships the built-in ones)::

    {
      "name": "llvm_cpu",
      "hardware": {"clock_mhz": 3000,
                   "mem_units": {"DRAM": {"size_KiB": 16777216}, "L2": {"size_KiB": 1024}},
                   "exec_units": {"CPU": {"count": 2, "ops_per_cycle": 16}},
                   "tx_units": {}, "buses": []},
      "device": "llvm_cpu.0",    (optional: the device it is for)
      "passes": [
        {"name": "tile_contractions", "pass": "autotile",
         "params": {"reqs": ["contraction"], "memory": "L2"}}
      ]
    }

Every ``params`` object is checked against the pass's config dataclass (``stripe.passes``): an
unknown pass or key, a missing field or a wrong type is a ``ConfigError`` pointing at the place
in the file, with the fix; so is a value the config class refuses (its ``invalid()``, if it has one,
names the key). ``target_config("llvm_cpu.0")`` loads the built-in config of a device
id's kind; ``load_config(path)`` a user's file.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from stripe.hardware import Bus, ExecUnit, Hardware, MemUnit, TxUnit  # noqa: F401 (type hints)
from stripe.jsonpos import KEY, positions
from tile.errors import Source, Span, TileError

TARGETS = Path(__file__).parent / "targets"


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


def builtin_names() -> list[str]:
    return sorted(p.stem for p in TARGETS.glob("*.json"))


def target_config(target: str) -> TargetConfig:
    """The built-in config for a target id (``llvm_cpu.0`` → ``llvm_cpu``) or config name."""
    kind = target.split(".", 1)[0]
    path = TARGETS / f"{kind}.json"
    if not path.exists():
        names = ", ".join(builtin_names())
        raise ConfigError(
            f"no built-in optimizer config for target '{target}'",
            None,
            f"the built-in configs are {names}; or give your own file (--config F.json)",
        )
    return load_config(path)


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
    required = {"name", "hardware", "passes"}
    reader.keys(data, (), required | {"description", "device"}, required, "a config")
    name_ = reader.convert(data["name"], str, ("name",))
    device = reader.convert(data.get("device", ""), str, ("device",))
    hardware = reader.convert(data["hardware"], Hardware, ("hardware",))
    passes = reader.convert(data["passes"], list, ("passes",))
    specs = tuple(reader.pass_spec(p, ("passes", k)) for k, p in enumerate(passes))
    return TargetConfig(name_, hardware, specs, name, device)


def pass_params(pass_name: str, params: dict) -> object:
    """A registered pass's config from a plain dict (tests and the API), checked like a file's."""
    text = json.dumps({"name": "params", "pass": pass_name, "params": params}, indent=1)
    reader = _Reader(Source(text, "<params>"), positions(text))
    return reader.pass_spec(json.loads(text), ()).params


class _Reader:
    def __init__(self, src: Source, pos: dict):
        self.src = src
        self.pos = pos

    def span(self, path: tuple) -> Span | None:
        while path not in self.pos and path:
            path = path[:-1]
        p = self.pos.get(path)
        return Span(p[0], p[1], p[2], self.src) if p else None

    def error(self, path: tuple, message: str, hint: str) -> ConfigError:
        return ConfigError(f"{_fmt(path)}: {message}" if path else message, self.span(path), hint)

    def keys(self, obj: dict, path: tuple, allowed: set[str], required: set[str], what: str) -> None:
        for k in obj:
            if k not in allowed:
                known = ", ".join(sorted(allowed)) or "none"
                raise self.error(path + (k, KEY), f"unknown key '{k}' in {what}", f"the keys are: {known}")
        for k in sorted(required):
            if k not in obj:
                raise self.error(path, f"{what} lacks the key '{k}'", f"add \"{k}\"")

    def pass_spec(self, obj, path: tuple) -> PassSpec:
        from stripe.passes import PASSES

        if not isinstance(obj, dict):
            raise self.error(path, "a pass is an object", 'write {"name": ..., "pass": ..., "params": {...}}')
        self.keys(obj, path, {"name", "pass", "params"}, {"name", "pass"}, "a pass")
        step = self.convert(obj["name"], str, path + ("name",))
        kind = self.convert(obj["pass"], str, path + ("pass",))
        if kind not in PASSES:
            known = ", ".join(sorted(PASSES))
            raise self.error(path + ("pass",), f"unknown pass '{kind}'", f"the passes are: {known}")
        params = obj.get("params", {})
        cfg = self.convert(params, PASSES[kind].config, path + ("params",), f"the params of pass '{kind}'")
        return PassSpec(step, kind, cfg)

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
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise self.error(path, f"expected a string, got {_kind(value)}", 'write "..."')
            return value
        raise AssertionError(f"config type {tp!r} is not supported")  # our bug: a pass config's type


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
