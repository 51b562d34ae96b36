"""Autotuning: time the cost model's best few tilings of each tiled block on the device, keep
the fastest, and remember it in the disk cache.

The blocks a step can tile, and the candidates it ranks for each, are the pass's ``sites``
(``stripe.passes.registry.PassInfo``); each trial is a full build by ``backends.driver``.

The cost models rank the candidates (``stripe.cost`` ``autotile``'s by traffic per flop,
``gemm_tile.GemmModel`` the GEMM kernels' work-group tiles, register blocks and K steps); the
device decides. For every ``autotile`` or ``gemm_tile`` step of the config and every block it
tiles (their ``sites``), the tuner tries the first ``tune_candidates`` (default 4) of the ranking,
one block at a time with the others at their best so far, each a full compile (the step's
``choices``) run on seeded small-integer inputs held on the device; a run's time is the fastest of
a few calls. Then the code generator's own knobs, which a backend may list in
``Device.tuning_space``, are timed the same way against its default. A candidate
that fails to build or run is skipped, and so is one whose generated code an earlier candidate
of the same block or knob already had (a knob set to the default's value). Only tilings change,
never the program's meaning: every candidate is the same computation (on integer-valued inputs the
results are equal exactly).

The choice is stored under a key of the device (id and description), the lowered Stripe program
(so the source, shapes and dtypes), the config and the settings that shape code, so a later
process compiles the tuned program without timing again; ``cache=False`` times afresh and stores
nothing, ``tune_refresh=True`` (``python -m tile tune --retune``) times afresh and stores.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from backends.diskcache import cache_dir, digest, read_entry, write_entry
from backends.driver import compile_bound, widened
from backends.hal import Device
from backends.options import CommonOptions
from stripe.config import TargetConfig
from stripe.ir import Block
from stripe.lower import lower
from stripe.passes import PASSES, steps
from stripe.printer import format_block
from tile.inputs import random_array
from tile.tensor import zeros_on
from tile.typed import BoundProgram

FORMAT = 2
_CODE_SETTINGS = ("opt", "fast_math", "local_size", "threads", "reorder", "parallel")


@dataclass
class Trial:
    step: str  # the autotile or gemm_tile step's name, or "codegen" for a code-generator setting
    block: str  # the block's name (the setting's name)
    rank: int  # its place in the cost model's ranking (0: the model's choice)
    tiles: tuple[int, ...]
    seconds: float | None  # None: it failed to build or run
    error: str = ""


@dataclass
class Tuning:
    choices: dict[str, dict[str, int]]  # step name -> block name -> rank
    settings: dict = field(default_factory=dict)  # code-generator settings (``Device.tuning_space``)
    trials: list[Trial] = field(default_factory=list)
    cached: bool = False
    path: str = ""


def with_choices(config: TargetConfig, choices: Mapping[str, Mapping[str, int]]) -> TargetConfig:
    """``config`` with the ``choices`` of each step that has search sites replaced by the tuned
    ones."""
    passes = tuple(
        replace(s, params=replace(s.params, choices=dict(choices[s.name]))) if s.name in choices else s
        for s in config.passes
    )
    return replace(config, passes=passes)


def tune_key(lowered: Block, device: Device, config: TargetConfig, settings: Mapping) -> str:
    opts = CommonOptions.parse(settings)
    meta = {
        "format": FORMAT,
        "kind": "tune",
        "device": device.id,
        "description": device.description,
        "config": repr(config),
        "strict": opts.strict,
        "settings": {k: settings[k] for k in _CODE_SETTINGS if settings.get(k) is not None},
        "candidates": opts.tune_candidates,
    }
    return digest(meta, format_block(lowered))


def tune(
    bound: BoundProgram,
    device: Device,
    config: TargetConfig,
    settings: Mapping,
    report: Callable[[Trial], None] | None = None,
) -> Tuning:
    """The fastest choices for ``bound`` on ``device`` (from the cache, else timed and stored);
    each trial is a full build by ``backends.driver``."""
    opts = CommonOptions.parse(settings)
    strict = opts.strict
    lowered = lower(bound, strict=strict, widen=widened(config, strict))
    key = tune_key(lowered, device, config, settings)
    path = cache_dir("tune") / f"{key}.json"
    use_cache = opts.cache
    if use_cache and not opts.tune_refresh:
        raw = read_entry(path, key)
        if raw is not None:
            got = json.loads(raw.decode())
            return Tuning(got["choices"], settings=got["settings"], cached=True, path=str(path))
    n = max(1, opts.tune_candidates)
    found = _sites(lowered, config, strict)
    choices: dict[str, dict[str, int]] = {step: {} for step in found}
    trials: list[Trial] = []
    feed: dict = {}  # made at the first trial
    base = {k: v for k, v in settings.items() if k not in ("tune", "config")}

    def timed(
        step: str, what: str, rank: int, tiles: tuple, cfg: TargetConfig, extra: dict, seen: dict
    ) -> float | None:
        if not feed:
            feed.update(_inputs(bound, device))
        took = _time(bound, device, cfg, {**base, **extra}, feed, seen, rank)
        got = Trial(step, what, rank, tuple(tiles), *took)
        trials.append(got)
        if report is not None:
            report(got)
        return got.seconds

    for step, blocks in found.items():
        for block, ranking in blocks.items():
            if len(ranking) < 2:
                continue  # one candidate (gemm_tile's cpu model): nothing to choose, nothing timed
            times, seen = {}, {}
            for rank in range(min(n, len(ranking))):
                cfg = with_choices(config, {**choices, step: {**choices[step], block: rank}})
                times[rank] = timed(step, block, rank, ranking[rank].tiles, cfg, {}, seen)
            choices[step][block] = _fastest(times)
    # then the code generator's own knobs (OpenCL: the GEMM kernels' tiles), the default first
    cfg = with_choices(config, choices)
    space = _space(bound, device, cfg, base)
    chosen: dict = {}
    if space:
        seen = {}
        times = {k: timed("codegen", ",".join(extra) or "default", k, _tiles(extra), cfg, extra, seen)
                 for k, extra in enumerate([{}, *space])}
        chosen = [{}, *space][_fastest(times)]
    if use_cache:
        write_entry(path, key, json.dumps({"choices": choices, "settings": chosen}).encode())
    return Tuning(choices, settings=chosen, trials=trials, cached=False, path=str(path))


def _fastest(times: Mapping[int, float | None]) -> int:
    """The rank that ran fastest (0, the default, when none ran)."""
    ran = {k: t for k, t in times.items() if t is not None}
    return min(ran, key=lambda k: ran[k]) if ran else 0


def _tiles(extra: Mapping) -> tuple[int, ...]:
    return tuple(v for vs in extra.values() if isinstance(vs, (list, tuple)) for v in vs)


def _space(bound, device, cfg: TargetConfig, settings: Mapping) -> list[dict]:
    """The device's code-generation settings worth timing for this program (``Device.tuning_space``
    of its default build); none when that build fails."""
    if type(device).tuning_space is Device.tuning_space:
        return []  # the backend has no knobs: no build needed to ask
    try:
        cp = compile_bound(bound, device, {**settings, "config": cfg})
    except Exception:  # noqa: BLE001 - the trials report it
        return []
    return list(device.tuning_space(cp.library))[: 2 * max(1, CommonOptions.parse(settings).tune_candidates)]


def _sites(lowered, config: TargetConfig, strict: bool) -> dict[str, dict[str, list]]:
    """For each autotile or gemm_tile step (by name): the blocks it tiles and their rankings, found
    on the program as it reaches that step."""
    out: dict[str, dict[str, list]] = {}
    before = lowered
    for spec, after, _ in steps(lowered, config, strict=strict):
        sites = PASSES[spec.pass_].sites
        if sites is not None:
            out[spec.name] = sites(before, spec.params, config.hardware)
        before = after
    return out


def _inputs(bound, device) -> dict:
    """Seeded small integers on the device, one tensor per input (timing without copies)."""
    rng = np.random.default_rng(0)
    feed = {}
    for name, t in bound.inputs:
        feed[name] = zeros_on(device, tuple(int(d) for d in t.shape), t.dtype)
        feed[name].write(random_array(feed[name].shape, t.dtype, rng))
    return feed


def _time(bound, device, cfg, settings, feed, seen: dict, rank: int) -> tuple[float | None, str]:
    """The fastest of a few calls (at most ~0.3 s of them) of ``bound`` compiled with ``cfg``;
    not timed when its code is a candidate's in ``seen`` (generated source -> rank)."""
    try:
        cp = compile_bound(bound, device, {**settings, "config": cfg})
        if cp.library.source in seen:
            return None, f"the same code as candidate {seen[cp.library.source]}"
        seen[cp.library.source] = rank
        out = {n: zeros_on(device, cp.buffers[n].sizes, cp.buffers[n].dtype) for n in cp.outputs}
        best, spent, calls = float("inf"), 0.0, -1  # the first call warms up
        while calls < 3 or (spent < 0.3 and calls < 20):
            start = time.perf_counter()
            for t in cp.run(feed, out=out).values():
                t.wait()
            took = time.perf_counter() - start
            if calls < 0:
                calls = 0
                continue
            best, spent, calls = min(best, took), spent + took, calls + 1
        return best, ""
    except Exception as e:  # noqa: BLE001 - a candidate the device cannot build or run is skipped
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
