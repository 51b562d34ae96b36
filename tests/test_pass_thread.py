"""The ``thread`` pass (GPU mapping): Before/Expected pairs in Stripe text (a leaf matmul, a row
sum, autotile-shaped input), the blocks it leaves alone, meaning and race-freedom on
Hypothesis-drawn programs, and LLVM runs of its output."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from ref_interp.stripe_exec import run_stripe
from stripe.config import TARGETS, parse_config
from stripe.ir import Block, RefDir, Special, Store
from stripe.parser import parse_stripe
from stripe.passes import PASSES, optimize
from stripe.passes.tiling import can_split, split
from stripe.verify import verify
from tests.llvm_runner import execute
from tests.pass_support import assert_same_meaning, check_rewrite, lowered, programs, run_pass
from tile.errors import TileError

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[i, j: M, N] = +(A[i, k] * B[k, j]); }"

MATMUL_BEFORE = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(64:64, 64:1)
    #input #user none B[0, 0] fp32(64:64, 64:1)
    #output #user none C[0, 0] fp32(64:64, 64:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(64:64, 64:1)
      in B[0, 0] fp32(64:64, 64:1)
      out C[0, 0] fp32(64:64, 64:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #kernel block [i:64, j:64, k:64] ( // k1_C
        in A[i, k] fp32(1:64, 1:1)
        in B[k, j] fp32(1:64, 1:1)
        out C[i, j]:add fp32(1:64, 1:1)
    ) {
      0: $A = load(A)
      1: $B = load(B)
      2: $v = mul($A, $B):fp32
      3: C = store($v)
    }
  }
}
"""

# i and j are owned; j (contiguous in C) fills the 16 work-items, k stays a loop in each.
MATMUL_EXPECTED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(64:64, 64:1)
    #input #user none B[0, 0] fp32(64:64, 64:1)
    #output #user none C[0, 0] fp32(64:64, 64:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(64:64, 64:1)
      in B[0, 0] fp32(64:64, 64:1)
      out C[0, 0] fp32(64:64, 64:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #gpu_group #kernel #group_idxs="i,j"
       block [i:64, j:4, k:1] ( // k1_C
        in A[i, 64*k] fp32(1:64, 64:1)
        in B[64*k, 16*j] fp32(64:64, 16:1)
        out C[i, 16*j]:add fp32(1:64, 16:1)
    ) {
      0: #gpu_thread #threads=16 #thread_idxs="i,j" block [i:1, j:16, k:64] ( // k1_C
          in A[i, k] fp32(1:64, 1:1)
          in B[k, j] fp32(1:64, 1:1)
          out C[i, j]:add fp32(1:64, 1:1)
      ) {
        0: $A = load(A)
        1: $B = load(B)
        2: $v = mul($A, $B):fp32
        3: C = store($v)
      }
    }
  }
}
"""

ROWSUM_BEFORE = """
0: #program block [] ( // program
    #input #user none I[0, 0] fp32(40:8, 8:1)
    #output #user none O[0] fp32(40:1)
) {
  0: #main block [] ( // main
      in I[0, 0] fp32(40:8, 8:1)
      out O[0] fp32(40:1)
  ) {
    0: #agg_op_add #contraction #kernel block [i:40, j:8] ( // k1_O
        in I[i, j] fp32(1:8, 1:1)
        out O[i]:add fp32(1:1)
    ) {
      0: $I = load(I)
      1: O = store($I)
    }
  }
}
"""

# j is the reduction: never a work-item. i's 40 rows go 10 to a group (10 divides 40 and fills
# more than half of the 16 work-items, so no idle work-item and no remainder constraint).
ROWSUM_EXPECTED = """
0: #program block [] ( // program
    #input #user none I[0, 0] fp32(40:8, 8:1)
    #output #user none O[0] fp32(40:1)
) {
  0: #main block [] ( // main
      in I[0, 0] fp32(40:8, 8:1)
      out O[0] fp32(40:1)
  ) {
    0: #agg_op_add #contraction #gpu_group #kernel #group_idxs="i" block [i:4, j:1] ( // k1_O
        in I[10*i, 8*j] fp32(10:8, 8:1)
        out O[10*i]:add fp32(10:1)
    ) {
      0: #gpu_thread #threads=10 #thread_idxs="i" block [i:10, j:8] ( // k1_O
          in I[i, j] fp32(1:8, 1:1)
          out O[i]:add fp32(1:1)
      ) {
        0: $I = load(I)
        1: O = store($I)
      }
    }
  }
}
"""

TILED_BEFORE = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(16:16, 16:1)
    #input #user none B[0, 0] fp32(16:16, 16:1)
    #output #user none C[0, 0] fp32(16:16, 16:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(16:16, 16:1)
      in B[0, 0] fp32(16:16, 16:1)
      out C[0, 0] fp32(16:16, 16:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #kernel #tiled block [i:4, j:4, k:2] ( // k1_C
        in A[4*i, 8*k] fp32(4:16, 8:1)
        in B[8*k, 4*j] fp32(8:16, 4:1)
        out C[4*i, 4*j]:add fp32(4:16, 4:1)
    ) {
      0: #tiled_inner block [i:4, j:4, k:8] ( // k1_C
          in A[i, k] fp32(1:16, 1:1)
          in B[k, j] fp32(1:16, 1:1)
          out C[i, j]:add fp32(1:16, 1:1)
      ) {
        0: $A = load(A)
        1: $B = load(B)
        2: $v = mul($A, $B):fp32
        3: C = store($v)
      }
    }
  }
}
"""

# The 4x4 tile fits 16 work-items: tags and attrs only. The outer k (a split reduction) is not a
# group index: each group loops over it.
TILED_EXPECTED_16 = TILED_BEFORE.replace(
    "#contraction #kernel #tiled block", '#contraction #gpu_group #kernel #tiled #group_idxs="i,j" block'
).replace("#tiled_inner block", '#gpu_thread #tiled_inner #threads=16 #thread_idxs="i,j" block')

# With 8 work-items the tile is split again: each work-item runs the middle block's 2 points.
TILED_EXPECTED_8 = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(16:16, 16:1)
    #input #user none B[0, 0] fp32(16:16, 16:1)
    #output #user none C[0, 0] fp32(16:16, 16:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(16:16, 16:1)
      in B[0, 0] fp32(16:16, 16:1)
      out C[0, 0] fp32(16:16, 16:1)
  ) {
    0: #agg_op_add #comb_op_mul #contraction #gpu_group #kernel #tiled #group_idxs="i,j"
       block [i:4, j:4, k:2] ( // k1_C
        in A[4*i, 8*k] fp32(4:16, 8:1)
        in B[8*k, 4*j] fp32(8:16, 4:1)
        out C[4*i, 4*j]:add fp32(4:16, 4:1)
    ) {
      0: #tiled_inner block [i:2, j:1, k:1] ( // k1_C
          in A[2*i, 8*k] fp32(2:16, 8:1)
          in B[8*k, 4*j] fp32(8:16, 4:1)
          out C[2*i, 4*j]:add fp32(2:16, 4:1)
      ) {
        0: #gpu_thread #threads=8 #thread_idxs="i,j" block [i:2, j:4, k:8] ( // k1_C
            in A[i, k] fp32(1:16, 1:1)
            in B[k, j] fp32(1:16, 1:1)
            out C[i, j]:add fp32(1:16, 1:1)
        ) {
          0: $A = load(A)
          1: $B = load(B)
          2: $v = mul($A, $B):fp32
          3: C = store($v)
        }
      }
    }
  }
}
"""

SHIFTED = """
0: #program block [] ( // program
    #input #user none I[0] fp32(6:1)
    #output #user none O[0] fp32(8:1)
) {
  0: #main block [] ( // main
      in I[0] fp32(6:1)
      out O[0] fp32(8:1)
  ) {
    0: #kernel block [i:6, k:3] ( // k1_O
        in I[i] fp32(1:1)
        out O[i + k]:add fp32(1:1)
    ) {
      0: $I = load(I)
      1: O = store($I)
    }
  }
}
"""


def test_registered_as_keeping_order():
    assert not PASSES["thread"].reorders


def test_matmul_64x64_over_16_threads():
    out = check_rewrite("thread", {"reqs": ["contraction"], "threads": 16}, MATMUL_BEFORE, MATMUL_EXPECTED)
    assert_same_meaning(parse_stripe(MATMUL_BEFORE), out)


def test_row_sum_never_threads_the_reduction():
    out = check_rewrite("thread", {"reqs": ["kernel"], "threads": 16}, ROWSUM_BEFORE, ROWSUM_EXPECTED)
    assert_same_meaning(parse_stripe(ROWSUM_BEFORE), out)


def test_already_tiled_input():
    for threads, expected in ((16, TILED_EXPECTED_16), (8, TILED_EXPECTED_8)):
        out = check_rewrite("thread", {"reqs": ["tiled"], "threads": threads}, TILED_BEFORE, expected)
        assert_same_meaning(parse_stripe(TILED_BEFORE), out)
        assert_race_free(out)


def test_threads_zero_reads_the_hardware():
    out = check_rewrite("thread", {"reqs": ["kernel"]}, MATMUL_BEFORE, None, target="opencl_gpu")
    inner = out.stmts[0].stmts[0].stmts[0]
    # opencl_gpu's 256 work-items: the whole j row (64), then 4 rows of i.
    assert dict(inner.attrs)["threads"] == 256
    assert [(i.name, i.range) for i in inner.idxs] == [("i", 4), ("j", 64), ("k", 64)]


def test_left_alone():
    # Nothing owned: a full reduction writes one element from every point.
    total = lowered("function (I[N]) -> (O) { O[] = +(I[i]); }", {"I": (12,)})
    assert run_pass("thread", {"reqs": ["contraction"], "threads": 4}, total) == total
    # O[i + k]: two points differing in i write one element (lowering would rename this to O[v0]).
    conv1 = parse_stripe(SHIFTED)
    assert run_pass("thread", {"reqs": ["kernel"], "threads": 4}, conv1) == conv1
    # Mapped once: running again changes nothing.
    once = run_pass("thread", {"reqs": ["kernel"], "threads": 16}, parse_stripe(MATMUL_BEFORE))
    assert run_pass("thread", {"reqs": ["kernel"], "threads": 16}, once) == once
    # Specials are not leaves.
    p = lowered("function (A[N, M]) -> (R) { R = reshape(A, M, N); }", {"A": (3, 4)})
    assert run_pass("thread", {"reqs": ["kernel"], "threads": 4}, p) == p


# ------------------------------------------------------------------------------ race freedom
def assert_race_free(program: Block, threads: int | None = None) -> None:
    """By enumeration: every element a mapped kernel writes is written by one work-item of one
    work-group (the group and thread index values of every point writing it agree), and each
    ``threads`` attr is the work-item count and at most ``threads``."""
    main = program.stmts[0]
    roots = {r.into: (r.into, 0, r.shape.dims) for r in main.refs}
    for k in main.stmts:
        if "gpu_group" not in k.tags:
            continue
        writers: dict[tuple[str, int], set] = {}
        _enumerate(k, {}, roots, (), (), writers, threads)
        for element, ids in writers.items():
            assert len(ids) == 1, f"{k.name}: element {element} written by work-items {sorted(ids)}"


def test_race_check_catches_a_threaded_reduction():
    """The enumeration is not vacuous: naming the row sum's reduction index a thread index (as a
    wrong mapping would) is caught."""
    out = run_pass("thread", {"reqs": ["kernel"], "threads": 16}, parse_stripe(ROWSUM_BEFORE))
    group = out.stmts[0].stmts[0]
    inner = group.stmts[0]
    wrong = replace(inner, attrs=(("threads", 80), ("thread_idxs", "i,j")))
    bad = replace(out, stmts=(replace(out.stmts[0], stmts=(replace(group, stmts=(wrong,)),)),))
    with pytest.raises(AssertionError, match="written by work-items"):
        assert_race_free(bad)


def _named(block: Block, attr: str) -> list[str]:
    value = dict(block.attrs).get(attr, "")
    return [v for v in value.split(",") if v]


def _enumerate(block, env, views, gid, tid, writers, threads) -> None:
    if "gpu_thread" in block.tags:
        count = 1
        for ix in block.idxs:
            if ix.name in _named(block, "thread_idxs"):
                count *= ix.range
        assert dict(block.attrs)["threads"] == count
        assert threads is None or count <= threads
    for values in itertools.product(*(range(ix.range) for ix in block.idxs)):
        local = {}
        for ix, v in zip(block.idxs, values):
            local[ix.name] = (int(ix.affine.evaluate(env)) if ix.affine is not None else 0) + v
        if any(c.evaluate(local) < 0 for c in block.constraints):
            continue
        g = gid + tuple(local[n] for n in _named(block, "group_idxs")) if "gpu_group" in block.tags else gid
        t = tid + tuple(local[n] for n in _named(block, "thread_idxs")) if "gpu_thread" in block.tags else tid
        mine = {}
        for r in block.refs:
            if r.source in views:
                buf, base, dims = views[r.source]
                base += sum(int(a.evaluate(local)) * d.stride for a, d in zip(r.access, dims))
                mine[r.into] = (buf, base, r.shape.dims)
        for s in block.stmts:
            if isinstance(s, Store) and s.into in mine:
                writers.setdefault(mine[s.into][:2], set()).add((g, t))
            elif isinstance(s, Block):
                _enumerate(s, local, mine, g, t, writers, threads)


# ------------------------------------------------------------------------------ meaning
@st.composite
def lowerable(draw):
    """``programs()``, less the drawn sources that do not lower (conformance also draws programs
    that must be refused, like an index only in a constraint)."""
    try:
        return draw(programs())
    except TileError:
        reject()


def _pretile(program: Block, draw) -> Block:
    """Autotile-shaped input: some leaf kernels split with drawn tiles."""
    main = program.stmts[0]
    stmts = []
    for k in main.stmts:
        leaf = can_split(k) and not any(isinstance(s, (Block, Special)) for s in k.stmts)
        if leaf and all(r.dir is not RefDir.NONE for r in k.refs) and draw(st.booleans()):
            tiles = {ix.name: draw(st.integers(1, ix.range)) for ix in k.idxs}
            sizes = {r.into: main.ref(r.source).shape.sizes for r in k.refs}
            k = split(k, tiles, outer_tags={"tiled"}, inner_tags={"tiled_inner"}, parent_sizes=sizes)
        stmts.append(k)
    return replace(program, stmts=(replace(main, stmts=tuple(stmts)),))


def test_meaning_and_race_freedom_on_drawn_programs():
    seen = {"all": 0, "changed": 0, "pairs": 0}

    @settings(
        derandomize=True,
        deadline=None,
        max_examples=40,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(lowerable(), st.sampled_from([1, 2, 3, 4, 8, 16, 64]), st.data())
    def check(case, threads, data):
        program, inputs = case
        if data.draw(st.booleans()):
            program = _pretile(program, data.draw)
            verify(program)
        out = run_pass("thread", {"reqs": ["kernel"], "threads": threads}, program)  # verifies
        seen["all"] += 1
        if out != program:
            seen["changed"] += 1
            seen["pairs"] += any("tiled" in k.tags and "gpu_group" in k.tags for k in out.stmts[0].stmts)
        assert [k.name for k in out.stmts[0].stmts] == [k.name for k in program.stmts[0].stmts]
        assert all("kernel" in k.tags for k in out.stmts[0].stmts)
        assert_same_meaning(program, out, inputs)
        assert_race_free(out, threads)

    check()
    assert seen["changed"] >= seen["all"] // 2 and seen["pairs"] >= 3, seen


# ------------------------------------------------------------------------------ pipeline
OPENCL_STEPS = [
    {
        "name": "tile_contractions",
        "pass": "autotile",
        "params": {
            "reqs": ["contraction"],
            "memory": "LOCAL",
            "outer_set": ["gpu_tile"],
            "inner_set": ["gpu_tile_inner"],
        },
    },
    {"name": "threads", "pass": "thread", "params": {"reqs": ["kernel"]}},
]


def test_in_the_opencl_pipeline_after_autotile():
    """The entry recommended for opencl_gpu, read from JSON: autotile's pairs become groups of
    work-items, elementwise leaves are split; verified after every pass; same meaning."""
    if "autotile" not in PASSES:
        pytest.skip("no autotile pass registered")
    data = json.loads((TARGETS / "opencl_gpu.json").read_text())
    cfg = parse_config(json.dumps({**data, "passes": OPENCL_STEPS}))
    src = "function (A[M, K], B[K, N]) -> (C) { T[i, j: M, N] = +(A[i, k] * B[k, j]); C = max(T, 0); }"
    program = lowered(src, {"A": (30, 20), "B": (20, 18)})
    out = optimize(program, cfg, check=True)
    kernels = out.stmts[0].stmts
    assert any("gpu_tile" in k.tags and "gpu_group" in k.tags for k in kernels)
    assert any("eltwise" in k.tags and "gpu_group" in k.tags for k in kernels)
    assert_same_meaning(program, out)
    assert_race_free(out, 256)


# ------------------------------------------------------------------------------ LLVM
def test_llvm_runs_the_mapped_matmul():
    rng = np.random.default_rng(2)
    inputs = {
        "A": rng.integers(-3, 4, (21, 13)).astype(np.float32),
        "B": rng.integers(-3, 4, (13, 19)).astype(np.float32),
    }
    program = lowered(MATMUL, {k: v.shape for k, v in inputs.items()})
    want = run_stripe(program, inputs)
    leaf = run_pass("thread", {"reqs": ["contraction"], "threads": 16}, program)
    main = program.stmts[0]
    k = main.stmts[1]
    sizes = {r.into: main.ref(r.source).shape.sizes for r in k.refs}
    tiled = split(
        k, {"i": 8, "j": 8, "k": 5}, outer_tags={"tiled"}, inner_tags={"tiled_inner"}, parent_sizes=sizes
    )
    tiled = replace(program, stmts=(replace(main, stmts=(main.stmts[0], tiled)),))
    pair = run_pass("thread", {"reqs": ["tiled"], "threads": 16}, tiled)
    # 21 rows in tiles of 8: the partial tiles' passthroughs (i_o = I) reach the work-item block,
    # whose 8x8 tile is split again into 2x8 work-items looping 4 times.
    middle = pair.stmts[0].stmts[1].stmts[0]
    inner = middle.stmts[0]
    assert [(i.name, i.range) for i in middle.idxs if i.affine is None] == [("i", 4), ("j", 1), ("k", 1)]
    assert [(i.name, i.range) for i in inner.idxs if i.affine is None] == [("i", 2), ("j", 8), ("k", 5)]
    assert dict(inner.attrs) == {"threads": 16, "thread_idxs": "i,j"}
    for out in (leaf, pair):
        assert "gpu_group" in out.stmts[0].stmts[1].tags
        assert_race_free(out, 16)
        got, _ = execute(out, inputs)
        np.testing.assert_array_equal(got["C"], want["C"])
