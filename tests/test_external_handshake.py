"""A backend's handshake that lacks a required field is refused naming the field (not, say, as
"version None"), whatever field it is; a wrong value is named with the value."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from backends.external import ExternalDevice
from backends.external.client import HELLO_REQUIRED
from tile.errors import TileBackendError

GOOD = {"protocol": "tile-external", "version": 1, "name": "hello-only", "stage": "tile", "dtypes": ["int32"]}

# prints its handshake, then waits for the client to close its stdin
BACKEND = "import sys\nsys.stdout.write(sys.argv[1] + '\\n')\nsys.stdout.flush()\nsys.stdin.read()\n"


def device(tmp_path, hello: dict) -> ExternalDevice:
    script = tmp_path / "hello_backend.py"
    script.write_text(BACKEND)
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(json.dumps(hello))}"
    return ExternalDevice(command, f"external:{command}", timeout=10, start_timeout=10)


def handshake_error(tmp_path, hello: dict) -> str:
    dev = device(tmp_path, hello)
    with pytest.raises(TileBackendError) as e:
        dev.capabilities  # noqa: B018 - the first look starts it and reads the handshake
    return e.value.message


def test_a_good_handshake_is_taken(tmp_path):
    dev = device(tmp_path, GOOD)
    try:
        assert dev.description.startswith("hello-only, in another process")
    finally:
        dev._discard()


@pytest.mark.parametrize("field", [f for f in HELLO_REQUIRED if f != "protocol"])
def test_a_missing_required_field_is_named(tmp_path, field):
    hello = {k: v for k, v in GOOD.items() if k != field}
    message = handshake_error(tmp_path, hello)
    said = f"broke the protocol in its handshake: it sent a handshake without the required field '{field}'"
    assert said in message and "None" not in message


def test_a_missing_protocol_is_not_a_handshake(tmp_path):
    message = handshake_error(tmp_path, {k: v for k, v in GOOD.items() if k != "protocol"})
    assert "sent a first line that is not a tile-external handshake" in message


@pytest.mark.parametrize(
    "version, words", [(None, "announced the version null, not a whole number"), ("1", 'version "1"'),
                       (3, "speaks tile-external version 3; this Tile speaks versions 1 and 2")]
)
def test_a_bad_version_is_named(tmp_path, version, words):
    assert words in handshake_error(tmp_path, {**GOOD, "version": version})
