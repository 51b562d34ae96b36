"""``python -m tile onnx model.onnx [--emit] [--target ID] [--inputs in.npz] [--output out.npz]``
(its arguments are declared in ``tile.cli``, which imports this module only when the command runs).

``--emit`` prints the model's Tile program; otherwise the model runs on the target with the
arrays of ``--inputs`` (an .npz whose keys are the model's input names) and each output is
printed (and saved with ``--output``).
"""

from __future__ import annotations

import argparse

import numpy as np

from tile.errors import TileInputError


def main(args: argparse.Namespace) -> int:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise TileInputError("python -m tile onnx needs the onnx package", None,
                             "pip install -e '.[onnx]' (or pip install onnx)") from None
    from tile.onnx.backend import BackendRep
    from tile.onnx.importer import import_model, load

    model = load(args.file)
    arrays = _read_inputs(args.inputs) if args.inputs else {}
    if args.emit:
        shapes = {k: v.shape for k, v in arrays.items()}
        print(import_model(model, shapes).source, end="")
        return 0
    rep = BackendRep(model, args.target)
    missing = [n for n in rep.input_names if n not in arrays]
    if missing:
        raise TileInputError(f"the model's inputs {', '.join(missing)} are not given", None,
                             f"pass --inputs in.npz with arrays named {', '.join(rep.input_names)}")
    named = rep.run_named({n: arrays[n] for n in rep.input_names})
    for name, value in named.items():
        print(f"{name}: {value.dtype}{list(value.shape)}")
        print(np.array2string(value, threshold=64))
    if args.output:
        np.savez(args.output, **{str(k): v for k, v in named.items()})
    return 0


def _read_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise TileInputError(f"cannot read the inputs '{path}': {e}", None, "give an .npz archive") from e

