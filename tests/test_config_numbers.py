"""The numbers of a config's hardware model: a size, count, thread count or rate that is zero or
negative, a fraction where a whole number is needed, or NaN/Infinity is refused at its place in
the file (line and column), not accepted to mislead the passes and the cost model later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stripe.config import ConfigError, parse_config

LLVM = Path(__file__).resolve().parent.parent / "stripe" / "targets" / "llvm_cpu.json"

CASES = [
    # (path to the number in the file, value, words of the error)
    (("mem_units", "L2", "size_KiB"), -4, "expected a positive number, got the integer -4"),
    (("mem_units", "L2", "size_KiB"), 0, "expected a positive number, got the integer 0"),
    (("mem_units", "L1", "line_bytes"), -64, "expected a positive number, got the integer -64"),
    (("mem_units", "L1", "count"), 0, "expected a positive number"),
    (("exec_units", "CPU", "count"), 0, "expected a positive number, got the integer 0"),
    (("exec_units", "CPU", "count"), 2.5, "expected an integer, got the number 2.5"),
    (("exec_units", "CPU", "threads"), 0, "expected a positive number, got the integer 0"),
    (("exec_units", "CPU", "threads"), -2, "expected a positive number"),
    (("exec_units", "CPU", "ops_per_cycle"), 0, "expected a positive number"),
    (("clock_mhz",), -3000, "expected a positive number, got the integer -3000"),
    (("buses", 0, "bytes_per_cycle"), 0.0, "expected a positive number, got the number 0.0"),
    (("mem_units", "L2", "size_KiB"), "NaN", "expected a finite number, got the number nan"),
    (("clock_mhz",), "Infinity", "expected a finite number, got the number inf"),
]


def _text_with(path: tuple, value) -> tuple[str, str]:
    """llvm_cpu.json with one hardware number changed; its text and the text of the value."""
    data = json.loads(LLVM.read_text())
    at = data["hardware"]
    for p in path[:-1]:
        at = at[p]
    marker = "__VALUE__"
    at[path[-1]] = marker
    shown = value if isinstance(value, str) else json.dumps(value)  # NaN/Infinity: as Python writes them
    return json.dumps(data, indent=1).replace(f'"{marker}"', shown), shown


@pytest.mark.parametrize("path, value, words", CASES, ids=[f"{c[0][-1]}={c[1]}" for c in CASES])
def test_a_bad_hardware_number_is_a_located_error(path, value, words):
    text, shown = _text_with(path, value)
    with pytest.raises(ConfigError) as e:
        parse_config(text, "my.json")
    assert words in e.value.message
    where = "hardware" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    assert e.value.message.startswith(f"{where}: ")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if f'"{path[-1]}": {shown}' in t)
    span = e.value.span
    assert span.line == line and span.source.line(line)[span.col - 1 :].startswith(shown)


def test_the_built_in_numbers_are_taken():
    cfg = parse_config(LLVM.read_text(), str(LLVM))
    assert cfg.hardware.mem_units["L2"].size_KiB == 512 and cfg.hardware.exec_units["CPU"].threads == 1
