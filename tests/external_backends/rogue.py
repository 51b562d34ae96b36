"""A tile-external backend that misbehaves in one chosen way, for tests/test_external.py.

    python rogue.py MODE [--once STATEFILE]

MODE picks the fault (see ``MODES``). With ``--once``, only the first process misbehaves: it
creates STATEFILE, and every later start (the client's restart) serves the interpreter properly
with ``python -m tile serve --target interp``'s code. Written without numpy or Tile, in the plain
way a backend in another language would speak the protocol.
"""

import json
import os
import sys
import time

SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}
HELLO = {"protocol": "tile-external", "version": 1, "name": "rogue", "stage": "tile", "dtypes": list(SIZES)}


def send(header, payload=b""):
    sys.stdout.buffer.write(json.dumps(header).encode() + b"\n" + payload)
    sys.stdout.buffer.flush()


def receive():
    """The next request's header (its input bytes read and dropped), or None at EOF."""
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    header = json.loads(line)
    for spec in header.get("inputs", []):
        sys.stdin.buffer.read(spec["nbytes"])
    return header


def nbytes(spec):
    n = SIZES[spec["dtype"]]
    for d in spec["shape"]:
        n *= d
    return n


def answer(header, mode):
    """The reply ``mode`` gives to a run request: header and bytes."""
    outs = [dict(o, nbytes=nbytes(o)) for o in header["outputs"]]
    rid = header["id"]
    if mode == "wrong_id":
        rid += 7
    elif mode == "wrong_shape":
        outs[0]["shape"] = outs[0]["shape"] + [2]
    elif mode == "wrong_dtype":
        outs[0]["dtype"] = "int32" if outs[0]["dtype"] != "int32" else "float32"
    elif mode == "bad_nbytes":
        outs[0]["nbytes"] += 4
    elif mode == "unknown_dtype":
        outs[0]["dtype"] = "complex64"
    elif mode == "missing_output":
        outs = outs[1:]
    for o in outs:
        o["nbytes"] = nbytes(o) if o["dtype"] in SIZES and mode != "bad_nbytes" else o["nbytes"]
    # wrong values of the right size: 0x41 bytes (65 as int8, about 12.08 as float32), bool 1
    payload = b"".join((b"\x01" if o["dtype"] == "bool" else b"\x41") * o["nbytes"] for o in outs)
    if mode == "truncated":
        payload = payload[: len(payload) // 2]
    return {"id": rid, "ok": True, "outputs": outs}, payload


def main(argv):
    mode = argv[0]
    if len(argv) == 3 and argv[1] == "--once":
        if os.path.exists(argv[2]):
            from backends.external.server import serve

            return serve("interp")
        open(argv[2], "w").close()
    print(f"rogue: started in mode {mode}", file=sys.stderr, flush=True)
    if mode == "die":
        print("rogue: cannot initialize the frobnicator", file=sys.stderr)
        return 3
    if mode == "garbage_handshake":
        sys.stdout.write("Welcome to my backend!\n")
        return 0
    if mode == "wrong_version":
        send(dict(HELLO, version=99))
        return 0
    if mode == "silent":
        time.sleep(3600)
    if mode == "noisy":  # much more stderr than a pipe holds, before and during the conversation
        sys.stderr.write("rogue: chatter\n" * 50000)
        from backends.external.server import serve

        return serve("interp")
    hello = HELLO
    if mode in ("record_stripe", "record_optimized"):  # argv[1]: where to write the programs it gets
        hello = dict(HELLO, stage=mode.removeprefix("record_"), config="llvm_cpu")
    if mode == "tiny_limit":
        hello = dict(HELLO, limits={"max_bytes": 64})
    send(hello)
    while (header := receive()) is not None:
        if header.get("op") == "bye":
            return 0
        if mode == "hang":
            time.sleep(3600)
        if mode == "crash":
            print("Traceback (most recent call last):", file=sys.stderr)
            print("rogue: segmentation fault (simulated)", file=sys.stderr)
            sys.stderr.flush()
            os._exit(139)
        if mode == "garbage_reply":
            sys.stdout.buffer.write(b"\x89PNG\r\n\x1a\n garbage\n")
            sys.stdout.buffer.flush()
            continue
        if mode in ("refuse_unknown", "failed"):
            kind = "refused" if mode == "refuse_unknown" else "failed"
            send(
                {
                    "id": header["id"],
                    "ok": False,
                    "error": {"kind": kind, "type": "FrobError", "message": "no frobnicator for this"},
                }
            )
            continue
        if mode.startswith("record_"):
            with open(argv[1], "a") as f:
                f.write(header["program"])
        head, payload = answer(header, mode)
        send(head, payload)
        if mode == "truncated":
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
