"""The ``localize`` pass: Before/Expected pairs in Stripe text, refusals, meaning by the interpreter
on Hypothesis-drawn programs (grouped or tiled first, so that temporaries have one user), and a
localized program run on the LLVM CPU backend.

The preprocessing helpers here (``wrap``, ``tile_contractions``, ``prepared``) are shared with
``test_pass_scalarize`` and ``test_pass_cleanup``."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stripe.ir import Block, RefDir, Refinement
from stripe.parser import parse_stripe
from stripe.passes.rewrite import fresh, passthrough, reads_writes, rename_refs
from stripe.passes.tiling import can_split, split
from tests.pass_support import assert_same_meaning, check_rewrite, inputs_for, programs, run_pass
from tile.affine import Affine

HYP = settings(
    derandomize=True,
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ------------------------------------------------------------------------------ preprocessing
def wrap(program: Block, lo: int, hi: int) -> Block:
    """A fusion-like grouping: ``#main``'s kernels ``lo:hi`` run, in order, inside one new kernel
    with no indexes that refines each buffer they use whole (so meaning is unchanged)."""
    main = program.stmts[0]
    ks = list(main.stmts)
    group = ks[lo:hi]
    if not group:
        return program
    used: list[str] = []
    for k in group:
        used.extend(r.source for r in k.refs if r.source not in used)
    refs = tuple(replace(main.ref(n), agg_op="") for n in used)
    inner = tuple(replace(k, tags=k.tags - {"kernel"}) for k in group)
    w = Block(f"group{lo}", (), (), refs, inner, frozenset({"kernel", "group"}))
    return replace(program, stmts=(replace(main, stmts=(*ks[:lo], w, *ks[hi:])),))


def tile_contractions(program: Block, tile: int) -> Block:
    """Every contraction kernel split (``tiling.split``) into tiles of ``tile`` on every index."""
    main = program.stmts[0]

    def tiled(k: Block) -> Block:
        if not k.has_tags("contraction") or not can_split(k):
            return k
        sizes = {r.into: main.ref(r.source).shape.sizes for r in k.refs}
        return split(k, {i.name: tile for i in k.idxs}, parent_sizes=sizes)

    ks = tuple(tiled(k) for k in main.stmts)
    return replace(program, stmts=(replace(main, stmts=ks),))


def _body(k: Block) -> tuple[Block, ...]:
    """A kernel as an inner block of one point (passthroughs of its indexes, for ``load_index``) over
    its own views (or the inner blocks of a kernel that ``fuse_eltwise`` built)."""
    if k.has_tags("test_fused"):
        return tuple(s for s in k.stmts if isinstance(s, Block))
    refs = tuple(replace(r, access=tuple(Affine() for _ in r.access), from_=None) for r in k.refs)
    idxs = tuple(passthrough(i.name) for i in k.idxs)
    return (Block(k.name, idxs, (), refs, k.stmts, k.tags - {"kernel"}),)


def _owns(r: Refinement, k: Block) -> bool:
    """Each point of ``k`` has its own element: every index with range > 1 is a whole dim."""
    dims = [a for a, d in zip(r.access, r.shape.dims) if d.size == 1]
    return all(i.range <= 1 or Affine.var(i.name) in dims for i in k.idxs)


def _fusable(a: Block, b: Block) -> bool:
    if not (a.has_tags("eltwise") and b.has_tags("eltwise")) or a.idxs != b.idxs or a.constraints:
        return False
    if b.constraints or any(i.affine is not None for i in a.idxs):
        return False
    if not all(isinstance(s, Block) for s in a.stmts) and any(isinstance(s, Block) for s in a.stmts):
        return False
    if any(isinstance(s, Block) for s in b.stmts) or not a.idxs:
        return False
    ra, wa = reads_writes(a)
    rb, wb = reads_writes(b)
    for name in (wa & (rb | wb)) | (wb & (ra | wa)):
        ka = [r for r in a.refs if r.source == name]
        kb = [r for r in b.refs if r.source == name]
        if len(ka) != 1 or len(kb) != 1 or ka[0].access != kb[0].access or ka[0].shape != kb[0].shape:
            return False
        if not _owns(ka[0], a):
            return False
    return all(r.from_ is None for r in (*a.refs, *b.refs))


def fuse_eltwise(program: Block) -> Block:
    """A simple elementwise fusion: two ``#eltwise`` kernels over the same indexes whose shared
    written buffers have one identical view that each point owns (the second one moved up past
    kernels touching none of its buffers) run, point by point, as one-point inner blocks of one
    kernel (tagged ``test_fused``)."""
    main = program.stmts[0]
    out: list[Block] = []
    for k in main.stmts:
        # k may move up past kernels that touch none of its buffers, to the nearest fusable one
        at = len(out) - 1
        mine = {r.source for r in k.refs}
        while at >= 0 and not _fusable(out[at], k) and not mine & {r.source for r in out[at].refs}:
            at -= 1
        if at >= 0 and _fusable(out[at], k):
            a = out.pop(at)
            refs = list(a.refs)
            inner = list(_body(a))
            (b,) = _body(k)
            names = {r.into for r in refs}
            for r in k.refs:
                same = next((x for x in refs if x.into == r.into), None)
                if same is not None and same.access == r.access and same.shape == r.shape:
                    refs[refs.index(same)] = replace(same, dir=_join(same.dir, r.dir))
                    continue
                name = r.into if same is None else fresh(r.into, names)
                names.add(name)
                refs.append(replace(r, into=name, from_=r.from_ or (None if name == r.into else r.into)))
                if name != r.into:
                    b = rename_refs(b, {r.into: name})
            tags = a.tags | k.tags | {"test_fused"}
            out.insert(at, Block(f"{a.name}+{k.name}", a.idxs, (), tuple(refs), (*inner, b), tags))
            continue
        out.append(k)
    return replace(program, stmts=(replace(main, stmts=tuple(out)),))


def _join(x: RefDir, y: RefDir) -> RefDir:
    return x if x is y else RefDir.INOUT




HOWS = ("fuse", "fuse+wrap", "wrap", "tile", "tile+wrap")


@st.composite
def prepared(draw, families=("contractions", "mixed", "elementwise"), hows=HOWS):
    """``(program, inputs)``: a drawn program with elementwise kernels fused, kernels grouped
    (``wrap``) and/or contractions tiled, so that localize, inline and scalarize find work."""
    program, inputs = draw(programs(families))
    how = draw(st.sampled_from(hows))
    if "fuse" in how:
        program = fuse_eltwise(program)
    if "tile" in how:
        program = tile_contractions(program, draw(st.integers(1, 2)))
    if "wrap" in how:
        lo = draw(st.integers(0, 2))
        program = wrap(program, lo, lo + draw(st.integers(2, 4)))
    return program, inputs


def run_passes(program: Block, names: list[str]) -> Block:
    for name in names:
        program = run_pass(name, {"reqs": ["main"]}, program)
    return program


# ------------------------------------------------------------------------------ Before/Expected
# T is a temporary that only k1 uses (after a zero kernel). k1's points j own the columns T[:, j],
# so T moves into k1 as a 2x1 local allocation; the nested views keep their accesses and take its
# dense strides (1:1 instead of 3:1); the zero kernel and the program buffer T go.
COLUMNS = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(2:3, 3:1)
    #tmp none T[0, 0] fp32(2:3, 3:1)
    #output #user none O[0] fp32(3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(2:3, 3:1)
      inout T[0, 0] fp32(2:3, 3:1)
      out O[0] fp32(3:1)
  ) {
    0: #kernel #special #zero block [] ( // k0_T
        out T[0, 0]:assign fp32(2:3, 3:1)
    ) {
      0: T = zero()
    }
    1: #kernel block [j:3] ( // k1
        in A[0, j] fp32(2:3, 1:1)
        inout T[0, j] fp32(2:3, 1:1)
        out O[j] fp32(1:1)
    ) {
      0: block [i:2] ( // fill
          in A[i, 0] fp32(1:3, 1:1)
          out T[i, 0]:add fp32(1:3, 1:1)
      ) {
        0: $a = load(A)
        1: T = store($a)
        2: T = store($a)
      }
      1: block [i:2] ( // sum
          in T[i, 0] fp32(1:3, 1:1)
          out O[0]:add fp32(1:1)
      ) {
        0: $t = load(T)
        1: O = store($t)
      }
    }
  }
}
"""

COLUMNS_LOCALIZED = """
0: #program block [] ( // program
    #input #user none A[0, 0] fp32(2:3, 3:1)
    #output #user none O[0] fp32(3:1)
) {
  0: #main block [] ( // main
      in A[0, 0] fp32(2:3, 3:1)
      out O[0] fp32(3:1)
  ) {
    0: #kernel block [j:3] ( // k1
        in A[0, j] fp32(2:3, 1:1)
        none T[0, 0] fp32(2:1, 1:1)
        out O[j] fp32(1:1)
    ) {
      0: block [i:2] ( // fill
          in A[i, 0] fp32(1:3, 1:1)
          out T[i, 0]:add fp32(1:1, 1:1)
      ) {
        0: $a = load(A)
        1: T = store($a)
        2: T = store($a)
      }
      1: block [i:2] ( // sum
          in T[i, 0] fp32(1:1, 1:1)
          out O[0]:add fp32(1:1)
      ) {
        0: $t = load(T)
        1: O = store($t)
      }
    }
  }
}
"""


def test_columns_localized():
    out = check_rewrite("localize", {"reqs": ["main"]}, COLUMNS, COLUMNS_LOCALIZED)
    assert_same_meaning(parse_stripe(COLUMNS), out)


# The recursive case: k's local allocation L is used by one nested block only, whose points own
# its elements: L moves further in, as one element per point.
RECURSIVE = """
0: #program block [] ( // program
    #input #user none A[0] i32(4:1)
    #output #user none O[0] i32(4:1)
) {
  0: #main block [] ( // main
      in A[0] i32(4:1)
      out O[0] i32(4:1)
  ) {
    0: #kernel block [] ( // k
        in A[0] i32(4:1)
        none L[0] i32(4:1)
        out O[0] i32(4:1)
    ) {
      0: block [i:4] ( // inner
          in A[i] i32(1:1)
          inout L[i] i32(1:1)
          out O[i] i32(1:1)
      ) {
        0: $a = load(A)
        1: L = store($a)
        2: $l = load(L)
        3: O = store($l)
      }
    }
  }
}
"""

RECURSIVE_LOCALIZED = """
0: #program block [] ( // program
    #input #user none A[0] i32(4:1)
    #output #user none O[0] i32(4:1)
) {
  0: #main block [] ( // main
      in A[0] i32(4:1)
      out O[0] i32(4:1)
  ) {
    0: #kernel block [] ( // k
        in A[0] i32(4:1)
        out O[0] i32(4:1)
    ) {
      0: block [i:4] ( // inner
          in A[i] i32(1:1)
          none L[0] i32(1:1)
          out O[i] i32(1:1)
      ) {
        0: $a = load(A)
        1: L = store($a)
        2: $l = load(L)
        3: O = store($l)
      }
    }
  }
}
"""


def test_recursive_local_allocation():
    out = check_rewrite("localize", {"reqs": ["main"]}, RECURSIVE, RECURSIVE_LOCALIZED)
    assert_same_meaning(parse_stripe(RECURSIVE), out)


def _variant(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_refusals_leave_the_program_alone():
    cases = [
        # another kernel also reads T
        _variant(
            COLUMNS,
            "    1: #kernel block [j:3] ( // k1",
            "    1: #kernel block [] ( // k2\n        in T[0, 0] fp32(2:3, 3:1)\n    ) {\n"
            "      0: $x = load(T)\n    }\n    2: #kernel block [j:3] ( // k1",
        ),
        # main has a second view of T, which k2 reads
        _variant(
            _variant(
                COLUMNS,
                "      out O[0] fp32(3:1)\n  ) {",
                "      out O[0] fp32(3:1)\n      in T2 = T[0, 0] fp32(2:3, 3:1)\n  ) {",
            ),
            "    1: #kernel block [j:3] ( // k1",
            "    1: #kernel block [] ( // k2\n        in T2[0, 0] fp32(2:3, 3:1)\n    ) {\n"
            "      0: $x = load(T2)\n    }\n    2: #kernel block [j:3] ( // k1",
        ),
        # a copy initializes T: not a zero fill
        _variant(
            COLUMNS,
            "out T[0, 0]:assign fp32(2:3, 3:1)\n    ) {\n      0: T = zero()",
            "in A[0, 0] fp32(2:3, 3:1)\n        out T[0, 0]:assign fp32(2:3, 3:1)\n    ) {\n"
            "      0: T = copy(A)",
        ),
        # every point of k1 sees all of T: data could flow between points
        _variant(COLUMNS, "inout T[0, j] fp32(2:3, 1:1)", "inout T[0, 0] fp32(2:3, 1:1)"),
        # the buffer is an output, not a temporary
        _variant(COLUMNS, "#tmp none T", "#output none T"),
        # k1's view has another dtype than the buffer (a conversion would be lost)
        _variant(COLUMNS, "inout T[0, j] fp32(2:3, 1:1)", "inout T[0, j] i8(2:3, 1:1)"),
    ]
    for text in cases:
        check_rewrite("localize", {"reqs": ["main"]}, text, text)


def test_nested_view_outside_the_kernel_view_is_refused():
    # peek reads L[i + 1] (access 1 inside inner's one-element view): a neighbour point's element
    text = _variant(RECURSIVE, "[i:4] ( // inner", "[i:3] ( // inner")
    text = _variant(
        text,
        "2: $l = load(L)\n        3: O = store($l)",
        "2: block [] ( // peek\n            in L[1] i32(1:1)\n            out O[0] i32(1:1)\n"
        "        ) {\n          0: $l = load(L)\n          1: O = store($l)\n        }",
    )
    check_rewrite("localize", {"reqs": ["main"]}, text, text)


# ------------------------------------------------------------------------------ meaning
SEEN = {"examples": 0, "changed": 0}


@HYP
@given(prepared())
def _localize_keeps_meaning(drawn):
    program, inputs = drawn
    out = run_pass("localize", {"reqs": ["main"]}, program)
    assert_same_meaning(program, out, inputs)
    SEEN["examples"] += 1
    SEEN["changed"] += out != program


def test_localize_keeps_meaning_on_drawn_programs():
    """Counted over the run, so that the test cannot pass with localize never acting."""
    SEEN.update(examples=0, changed=0)
    _localize_keeps_meaning()
    assert SEEN["examples"] >= 30, SEEN
    assert SEEN["changed"] >= SEEN["examples"] // 4, SEEN


# ------------------------------------------------------------------------------ LLVM
def test_localized_program_runs_on_llvm():
    from ref_interp.stripe_exec import run_stripe
    from tests.llvm_runner import assert_same, execute

    before = parse_stripe(COLUMNS)
    out = run_pass("localize", {"reqs": ["main"]}, before)
    inputs = inputs_for(before)
    got, kernels = execute(out, inputs)
    assert len(kernels) == 1
    assert_same(got, run_stripe(before, inputs))
