"""``tile.compile`` refuses settings no part of Tile reads (a misspelt ``strict`` would be ignored)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tile
from tile.settings import KNOWN, TileSettingsError, check

SRC = "function (A[N]) -> (B) { B = A + 1; }"
ROOT = Path(__file__).resolve().parent.parent


def test_a_misspelt_setting_is_an_error_naming_the_nearest():
    with pytest.raises(TileSettingsError) as err:
        tile.compile(SRC, device="interp", settings={"stirct": True})
    assert "unknown setting 'stirct'" in str(err.value)
    assert "did you mean 'strict'" in str(err.value)


def test_a_name_like_nothing_lists_the_settings():
    with pytest.raises(TileSettingsError) as err:
        check({"gemm_tiles": [64, 64, 8, 8, 8]})
    assert "did you mean" not in str(err.value)
    assert "strict" in str(err.value)


def test_known_settings_compile_and_run():
    ex = tile.compile(SRC, device="interp", settings={"strict": True, "cache": False})
    np.testing.assert_array_equal(ex(A=np.arange(3.0))["B"], np.arange(3.0) + 1)


def test_every_setting_the_code_reads_is_known():
    """Each ``settings.get("name")`` / ``settings["name"]`` in the packages names a known setting,
    so adding a setting to a backend without listing it fails here, not for the user."""
    pattern = re.compile(r"\b(?:settings|s|build)(?:\.get\(|\[)\"([a-z_]+)\"")
    read = set()
    for pkg in ("tile", "backends", "stripe"):
        for path in (ROOT / pkg).rglob("*.py"):
            read |= set(pattern.findall(path.read_text()))
    assert read, "the pattern found no settings read: it is out of date"
    assert read - set(KNOWN) == set()
