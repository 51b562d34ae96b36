"""Every conformance failure message prints ``python -m conformance.reproduce DIR`` (and the README
``python -m conformance.bisect DIR``): those commands must work from any folder where Tile is
installed, not only in the checkout, so ``conformance`` is one of the packages pyproject.toml
installs.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _outside(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` run in ``tmp_path`` with only the installed packages importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("module", ["conformance.reproduce", "conformance.bisect"])
def test_the_commands_work_outside_the_checkout(tmp_path, module):
    if _outside(tmp_path, "-c", "import tile").returncode != 0:
        pytest.skip("Tile is not installed in this Python (pip install -e .): only the checkout has it")
    run = _outside(tmp_path, "-m", module, "--help")
    assert run.returncode == 0, (
        f"{run.stderr}\n(pyproject.toml installs the conformance package: after changing it, "
        "reinstall with `pip install -e . --no-deps`)"
    )
    assert f"python -m {module}" in run.stdout
    where = _outside(tmp_path, "-c", "import conformance, tile; print(conformance.__file__, tile.__file__)")
    conformance_file, tile_file = where.stdout.split()
    assert os.path.dirname(os.path.dirname(conformance_file)) == os.path.dirname(os.path.dirname(tile_file))
