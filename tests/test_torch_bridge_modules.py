"""tile.torch ops inside ``nn.Module``s (issue 37): a weight's fixed shape beside symbolic sizes
under ``torch.compile(dynamic=True)``; ``copy.deepcopy``, pickling and ``torch.save`` of a module
holding an op (it pickles as its definition); ``torch.export`` programs saved with their Tile
sources (``tile.torch.save``/``load``) and loaded in a process that never made the op; ``None``
inputs refused by name.
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

import tile
from backends import registry

torch = pytest.importorskip("torch", reason="tile.torch needs PyTorch (pip install -e '.[torch]')")
tt = pytest.importorskip("tile.torch", reason="tile.torch needs PyTorch")

pytestmark = pytest.mark.skipif(
    "llvm_cpu.0" not in registry.devices(), reason="tile.torch runs CPU tensors on llvm_cpu.0"
)

LINEAR = "function (X[N, I], W[O, I], B[O]) -> (Y) { Z[n, o: N, O] = +(X[n, i] * W[o, i]); Y = Z + B; }"
MATMUL = "function (A[M, L], B[L, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"


def ints(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).float()


class Linear(torch.nn.Module):
    def __init__(self, op, n_in: int, n_out: int):
        super().__init__()
        self.op = op
        self.weight = torch.nn.Parameter(ints(n_out, n_in, seed=1))
        self.bias = torch.nn.Parameter(ints(n_out, seed=2))

    def forward(self, x):
        return self.op(x, self.weight, self.bias)


def test_dynamic_shapes_with_a_module_weight_of_fixed_shape():
    """Parameters keep fixed sizes under dynamic=True; the input's SymInt for 'I' is the weight's 4
    (was: "dimension 'I' is _s1 ... but 4 in 'W'"). Three batch sizes, one graph, exact values."""
    from torch._dynamo.testing import CompileCounter

    layer = Linear(tt.op(LINEAR, name="s_linear"), 4, 3)
    counter = CompileCounter()
    compiled = torch.compile(layer, dynamic=True, fullgraph=True, backend=counter)
    for n in (5, 7, 9):
        x = ints(n, 4, seed=n)
        assert torch.equal(compiled(x), x @ layer.weight.detach().T + layer.bias.detach())
    assert counter.frame_count == 1
    x = ints(6, 4, seed=3)
    compiled(x).sum().backward()  # the backward under dynamic shapes too
    assert torch.equal(layer.weight.grad, torch.ones(6, 3).T @ x)
    with pytest.raises(Exception, match="'I'"):  # a real mismatch is still one, in Tile's terms
        compiled(ints(5, 2))


def test_deepcopy_pickle_and_torch_save_of_a_module_holding_an_op(tmp_path):
    layer = Linear(tt.op(LINEAR, name="s_linear"), 4, 3)
    x = ints(2, 4)
    twin = copy.deepcopy(layer)  # was: cannot pickle '_thread.lock'
    assert twin.op is layer.op and twin.weight is not layer.weight
    assert torch.equal(twin(x), layer(x))
    assert pickle.loads(pickle.dumps(layer.op)) is layer.op  # the registered op, by its definition
    torch.save({"op": layer.op, "state": layer.state_dict()}, tmp_path / "layer.pt")
    code = (  # a fresh process that never made the op: loading makes it from its source
        "import sys, torch, tile.torch as tt\n"
        f"saved = torch.load({str(tmp_path / 'layer.pt')!r}, weights_only=False)\n"
        "op, s = saved['op'], saved['state']\n"
        "assert op.name == 's_linear' and tt._OPS['s_linear'] is op\n"
        "x = torch.arange(8.0).reshape(2, 4)\n"
        "assert torch.equal(op(x, s['weight'], s['bias']), x @ s['weight'].T + s['bias'])\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_torch_export_program_saved_with_its_tile_sources(tmp_path):
    layer = Linear(tt.op(LINEAR, name="s_linear"), 4, 3)
    program = torch.export.export(layer, (ints(2, 4),))
    tt.save(program, tmp_path / "linear.pt2")
    code = (  # loaded where no tile.torch op was made: tile.torch.load makes it from the file
        "import torch, tile.torch as tt\n"
        f"program = tt.load({str(tmp_path / 'linear.pt2')!r})\n"
        "x = torch.arange(8.0).reshape(2, 4)\n"
        "w, b = program.state_dict['weight'], program.state_dict['bias']\n"
        "assert torch.equal(program.module()(x), x @ w.T + b)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_none_input_is_refused_by_name():
    mm = tt.op(MATMUL, name="s_matmul")
    with pytest.raises(tile.TileInputError, match="input 'A' is None, not a tensor"):
        mm(None, torch.ones(3, 4))
    with pytest.raises(tile.TileInputError, match="input 'B' is None"):
        mm(torch.ones(2, 3, requires_grad=True), None)
    with pytest.raises(tile.TileInputError, match="input 'B' is a float"):
        mm(torch.ones(2, 3), 2.0)
