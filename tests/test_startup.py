"""Start-up and the minimal install: ``import tile`` loads none of the heavy or optional packages,
Tile works where torch and jax cannot be imported (``pip install -e .`` without extras), and
``python -m tile devices`` answers from the listing kept on disk (``backends/listing.py``): the
same listing, without loading a backend, until something it depends on changes.

Every check of what a start imports runs in a fresh interpreter (a subprocess): this process has
loaded everything already. No timings are asserted here; bench/RESULTS.md has them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from backends import diskcache, listing, registry

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("ml_dtypes", "torch", "jax", "sympy", "pyopencl", "llvmlite")
# a prelude that makes the frameworks absent, as in an install without the torch and jax extras
NO_FRAMEWORKS = textwrap.dedent(
    """
    import sys

    class NoFrameworks:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("torch", "jax", "jaxlib"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoFrameworks())
    """
)


def python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == 0, f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    return r


def loaded_after(code: str) -> set[str]:
    """The top-level modules of HEAVY that ``code`` leaves in ``sys.modules``."""
    out = python(f"{code}\nimport sys; print(sorted({{m.partition('.')[0] for m in sys.modules}}))")
    return set(eval(out.stdout.strip().splitlines()[-1])) & set(HEAVY)  # noqa: S307 - our own print


def test_import_tile_loads_no_heavy_or_optional_package():
    assert loaded_after("import tile") == set()


def test_the_cli_parser_loads_no_heavy_or_optional_package():
    assert loaded_after("from tile.cli import build_parser; build_parser()") == set()


def test_bfloat16_still_loads_ml_dtypes_when_asked_for():
    code = ("from tile.dtypes import DType, BFLOAT16_NUMPY; import ml_dtypes, numpy as np\n"
            "assert DType.BFLOAT16.numpy == BFLOAT16_NUMPY == np.dtype(ml_dtypes.bfloat16)\n"
            "assert DType.of(BFLOAT16_NUMPY) is DType.BFLOAT16 and DType.BFLOAT16.bits == 16")
    assert "ml_dtypes" in loaded_after(code)


def test_a_float32_program_on_the_interpreter_loads_no_ml_dtypes():
    code = ("import numpy as np, tile\n"
            "f = tile.compile('function (A[N]) -> (O) { O = exp(A) + 1; }', 'interp')\n"
            "assert f(A=np.zeros(3, np.float32))['O'].tolist() == [2, 2, 2]")
    assert "ml_dtypes" not in loaded_after(code)


def test_dtype_of_bfloat16_by_name_needs_no_ml_dtypes():
    code = "from tile.dtypes import DType\nassert DType.of('bfloat16') is DType.BFLOAT16"
    assert "ml_dtypes" not in loaded_after(code)


def test_tile_compiles_and_runs_without_torch_and_jax():
    """What ``pip install -e .`` gives (no extras): programs compile and run on the interpreter and
    on llvm_cpu.0 (where it works), equal to numpy on integer-valued inputs; ``tile.torch`` says what
    to install."""
    code = NO_FRAMEWORKS + textwrap.dedent(
        """
        import json, numpy as np, tile
        from backends import registry
        src = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"
        a = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
        b = np.arange(8, dtype=np.float32).reshape(4, 2)
        ran = {}
        for device in ["interp", *(["llvm_cpu.0"] if "llvm_cpu.0" in registry.ids() else [])]:
            ran[device] = tile.compile(src, device)(A=a, B=b)["C"].tolist()
        try:
            tile.torch
            torch_error = None
        except AttributeError as e:
            torch_error = str(e)
        print(json.dumps({"ran": ran, "torch": torch_error,
                          "frameworks": sorted(m for m in sys.modules if m.startswith(("torch", "jax")))}))
        """
    )
    out = json.loads(python(code).stdout.strip().splitlines()[-1])
    want = (np.arange(-6, 6).reshape(3, 4) @ np.arange(8).reshape(4, 2)).tolist()
    assert out["ran"] and all(got == want for got in out["ran"].values()), out["ran"]
    assert "pip install" in out["torch"] and out["frameworks"] == []


# ------------------------------------------------------------------------ the devices listing


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache directory, and a fake probe that counts its calls."""
    monkeypatch.setenv("TILE_CACHE_DIR", str(tmp_path))
    probes = []
    found = listing.Listing(
        (listing.Listed("llvm_cpu.0", "a CPU", True, True), listing.Listed("prog.0", "a program", False,
                                                                            False, "tile")),
        {"opencl": "no OpenCL platform"},
    )

    def probe():
        probes.append(1)
        return found

    monkeypatch.setattr(listing, "probe", probe)
    return probes, found


def test_a_kept_listing_is_the_same_listing_without_probing(cache):
    probes, found = cache
    first = listing.listing()
    second = listing.listing()
    assert len(probes) == 1 and not first.cached and second.cached
    assert second.devices == found.devices and second.unavailable == found.unavailable
    assert second.ids() == ["interp", "llvm_cpu.0", "prog.0"]
    listing.listing(fresh=True)
    assert len(probes) == 2  # --fresh probes whatever is kept


@pytest.mark.parametrize("changed", ["packages", "opencl_icds", "cpu", "entry_points", "env"])
def test_a_changed_key_probes_again(cache, monkeypatch, changed):
    probes, _ = cache
    key = listing.probe_key()
    assert changed in key
    listing.listing()
    monkeypatch.setattr(listing, "probe_key", lambda: {**key, changed: "something else"})
    assert not listing.listing().cached and len(probes) == 2
    assert listing.listing().cached and len(probes) == 2  # and keeps the new one


def test_the_key_follows_the_driver_packages_and_installs(monkeypatch):
    key = listing.probe_key()
    monkeypatch.setattr(listing, "_version", lambda name: "9.9" if name == "pyopencl" else None)
    assert listing.probe_key()["packages"] != key["packages"]
    monkeypatch.setenv("POCL_DEVICES", "pthread")
    assert listing.probe_key()["env"] != key["env"]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty", "other layout"])
def test_a_corrupt_kept_listing_is_ignored_and_rewritten(cache, damage):
    probes, found = cache
    listing.listing()
    path = listing.cache_file()
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        path.write_bytes(raw[:-3] + bytes([raw[-3] ^ 0xFF]) + raw[-2:])
    elif damage == "garbage":
        path.write_bytes(b"\x00not a listing" * 10)
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a whole, checked entry under the right key, holding something that is not a listing
        key = diskcache.digest(listing.probe_key(), "tile devices listing")
        diskcache.write_entry(path, key, json.dumps({"devices": [[1, 2]], "unavailable": []}).encode())
    again = listing.listing()
    assert not again.cached and len(probes) == 2 and again.devices == found.devices
    assert listing.listing().cached and len(probes) == 2  # rewritten whole


def test_the_probe_lists_what_the_registry_finds():
    found = listing.probe()
    assert found.ids() == registry.ids() and found.unavailable == registry.unavailable()
    for d in found.devices:
        dev = registry.get(d.id)
        caps = dev.capabilities
        assert (d.description, d.fp64, d.fp16) == (dev.description, caps.fp64, caps.fp16)


def test_python_m_tile_devices_keeps_its_listing_and_then_loads_no_backend(tmp_path):
    env = {**os.environ, "TILE_CACHE_DIR": str(tmp_path)}
    run = [sys.executable, "-m", "tile", "devices"]
    first = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-X", "importtime", *run[1:]], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert second.returncode == 0 and second.stdout == first.stdout
    imported = {line.split("|")[-1].strip() for line in second.stderr.splitlines() if "|" in line}
    assert not {m.partition(".")[0] for m in imported} & set(HEAVY)
    assert not any(m.startswith(("backends.llvm", "backends.opencl", "backends.plaidml")) for m in imported)
    fresh = subprocess.run([*run, "--fresh"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert fresh.returncode == 0 and fresh.stdout == first.stdout
