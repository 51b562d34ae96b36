"""Autotuning: time the cost model's best few tilings of each autotiled block on the device, keep
the fastest, and remember it in the disk cache.

The cost model (``stripe.cost``) ranks ``autotile``'s candidates by traffic per flop; the device
decides. For every ``autotile`` step of the config and every block it tiles (``autotile.sites``),
the tuner tries the first ``tune_candidates`` (default 4) of the ranking, one block at a time with
the others at their best so far, each a full compile (``AutotileConfig.choices``) run on seeded
small-integer inputs held on the device; a run's time is the fastest of a few calls. A candidate
that fails to build or run is skipped. Only tilings change, never the program's meaning: every
candidate is the same computation (on integer-valued inputs the results are equal exactly).

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
from stripe.config import TargetConfig
from stripe.passes import steps
from stripe.passes.autotile import sites
from stripe.printer import format_block

FORMAT = 1
_CODE_SETTINGS = ("opt", "fast_math", "local_size", "threads", "reorder", "parallel")


@dataclass
class Trial:
    step: str  # the autotile step's name
    block: str  # the block's name
    rank: int  # its place in the cost model's ranking (0: the model's choice)
    tiles: tuple[int, ...]
    seconds: float | None  # None: it failed to build or run
    error: str = ""


@dataclass
class Tuning:
    choices: dict[str, dict[str, int]]  # step name -> block name -> rank
    trials: list[Trial] = field(default_factory=list)
    cached: bool = False
    path: str = ""


def with_choices(config: TargetConfig, choices: Mapping[str, Mapping[str, int]]) -> TargetConfig:
    """``config`` with each autotile step's ``choices`` replaced by the tuned ones."""
    passes = tuple(
        replace(s, params=replace(s.params, choices=dict(choices[s.name]))) if s.name in choices else s
        for s in config.passes
    )
    return replace(config, passes=passes)


def tune_key(lowered, device, config: TargetConfig, settings: Mapping) -> str:
    meta = {
        "format": FORMAT,
        "kind": "tune",
        "device": device.id,
        "description": device.description,
        "config": repr(config),
        "strict": bool(settings.get("strict", False)),
        "settings": {k: settings[k] for k in _CODE_SETTINGS if settings.get(k) is not None},
        "candidates": int(settings.get("tune_candidates", 4)),
    }
    return digest(meta, format_block(lowered))


def tune(
    compiled_cls,
    bound,
    lowered,
    device,
    config: TargetConfig,
    settings: Mapping,
    report: Callable[[Trial], None] | None = None,
) -> Tuning:
    """The fastest choices for ``bound`` on ``device`` (from the cache, else timed and stored).
    ``compiled_cls`` is ``backends.runner.CompiledProgram`` (passed in: the runner calls this)."""
    key = tune_key(lowered, device, config, settings)
    path = cache_dir("tune") / f"{key}.json"
    use_cache = bool(settings.get("cache", True))
    if use_cache and not settings.get("tune_refresh"):
        raw = read_entry(path, key)
        if raw is not None:
            return Tuning(json.loads(raw.decode())["choices"], cached=True, path=str(path))
    strict = bool(settings.get("strict", False))
    n = max(1, int(settings.get("tune_candidates", 4)))
    found = _sites(lowered, config, strict)
    choices: dict[str, dict[str, int]] = {step: {} for step in found}
    trials: list[Trial] = []
    if any(found.values()):
        feed = _inputs(bound, device)
        base = {k: v for k, v in settings.items() if k not in ("tune", "config")}
        best_time = None
        for step, blocks in found.items():
            for block, ranking in blocks.items():
                best_rank = 0
                for rank in range(min(n, len(ranking))):
                    trial = dict(choices[step])
                    trial[block] = rank
                    cfg = with_choices(config, {**choices, step: trial})
                    t = _time(compiled_cls, bound, device, cfg, base, feed)
                    got = Trial(step, block, rank, ranking[rank].tiles, *t)
                    trials.append(got)
                    if report is not None:
                        report(got)
                    if got.seconds is not None and (best_time is None or got.seconds < best_time):
                        best_time, best_rank = got.seconds, rank
                choices[step][block] = best_rank
    if use_cache:
        write_entry(path, key, json.dumps({"choices": choices}).encode())
    return Tuning(choices, trials, cached=False, path=str(path))


def _sites(lowered, config: TargetConfig, strict: bool) -> dict[str, dict[str, list]]:
    """For each autotile step (by name): the blocks it tiles and their rankings, found on the
    program as it reaches that step."""
    out: dict[str, dict[str, list]] = {}
    before = lowered
    for spec, after, _ in steps(lowered, config, strict=strict):
        if spec.pass_ == "autotile":
            out[spec.name] = sites(before, spec.params, config.hardware)
        before = after
    return out


def _inputs(bound, device) -> dict:
    """Seeded small integers on the device, one tensor per input (timing without copies)."""
    from tile.inputs import random_array
    from tile.tensor import zeros_on

    rng = np.random.default_rng(0)
    feed = {}
    for name, t in bound.inputs:
        feed[name] = zeros_on(device, tuple(int(d) for d in t.shape), t.dtype)
        feed[name].write(random_array(feed[name].shape, t.dtype, rng))
    return feed


def _time(compiled_cls, bound, device, cfg, settings, feed) -> tuple[float | None, str]:
    """The fastest of a few calls (at most ~0.3 s of them) of ``bound`` compiled with ``cfg``."""
    from tile.tensor import zeros_on

    try:
        cp = compiled_cls(bound, device, {**settings, "config": cfg})
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
