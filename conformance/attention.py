"""Attention-shaped programs (issue 41) and the tolerance a fused attention kernel is checked with.

``source(spec)`` writes the plain softmax attention any user writes (``S = Q·K``, the row max,
``exp``, the row sum, ``E·V``, the division), in the variants ``stripe.passes.attention`` fuses:
batch and head dims, any scale (multiplied, divided, or folded into a score kernel), a causal
mask written as constraints or as a ``cond`` on ``index``, a bias added to S, keys as many as or
other than the rows, V as wide as Q or not, the division last or the weights normalized first
(``A = E / Z; O = A·V``), K and V shared by the heads or not. ``cases()`` draws them with random
normal inputs;
``tolerance`` is docs/semantics.md §8.7's bound on how far a fused kernel (an online softmax, in
float32) may be from the interpreter's chain; ``reference`` is the float64 result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


@dataclass(frozen=True)
class Spec:
    batch: tuple[int, ...] = (2,)  # batch and head extents (0 to 2 of them)
    rows: int = 8
    keys: int = 8
    depth: int = 4
    width: int = 4
    scale: float = 0.125
    scale_form: str = "mul"  # mul: exp((S - Mx) * c); div: exp((S - Mx) / (1/c)); score: Sc = S * c
    mask: str = "none"  # none, constraint (causal, on the sums), cond (causal, -inf in the score)
    bias: bool = False  # P = S + Bias[rows, keys]
    normalized: bool = False  # the weights E / Z first, then O = (E / Z)·V (softmax, then product)
    shared_kv: bool = False  # K and V without the last batch dim: heads share them (multi-query)
    dtype: str = "float32"

    @property
    def c(self) -> float:
        """The exponent's scale as the program computes it."""
        return 1 / (1 / self.scale) if self.scale_form == "div" else self.scale


def source(spec: Spec) -> str:
    """The Tile program of ``spec`` (module docstring)."""
    bn = [f"B{n}" for n in range(len(spec.batch))]
    bi = [f"b{n}" for n in range(len(spec.batch))]

    def dims(*rest: str) -> str:
        return ", ".join([*bn, *rest])

    def at(*rest: str) -> str:
        return ", ".join([*bi, *rest])

    kv_bn, kv_bi = (bn[:-1], bi[:-1]) if spec.shared_kv and bn else (bn, bi)

    def kv(*rest: str) -> str:
        return ", ".join([*kv_bi, *rest])

    kv_dims = ", ".join(kv_bn)
    kv_dims += ", " if kv_dims else ""
    ins = [f"Q[{dims('N', 'D')}]", f"K[{kv_dims}M, D]", f"V[{kv_dims}M, W]"]
    if spec.bias:
        ins.append("Bias[N, M]")
    cons = ", i - j < N" if spec.mask == "constraint" else ""
    lines = [f"S[{at('i', 'j')}: {dims('N', 'M')}] = +(Q[{at('i', 'd')}] * K[{kv('j', 'd')}]);"]
    p = "S"
    if spec.scale_form == "score":
        lines.append(f"Sc = S * {spec.scale!r};")
        p = "Sc"
    if spec.bias:
        lines.append(f"Sb = {p} + Bias;")
        p = "Sb"
    if spec.mask == "cond":
        n = len(spec.batch)
        lines.append(f"Sm = cond(index(S, {n + 1}) <= index(S, {n}), {p}, -1.0 / 0.0);")
        p = "Sm"
    lines.append(f"Mx[{at('i', '0')}: {dims('N', '1')}] = >({p}[{at('i', 'j')}]){cons};")
    if spec.scale_form == "mul":
        lines.append(f"E = exp(({p} - Mx) * {spec.scale!r});")
    elif spec.scale_form == "div":
        lines.append(f"E = exp(({p} - Mx) / {1 / spec.scale!r});")
    else:
        lines.append(f"E = exp({p} - Mx);")
    lines.append(f"Z[{at('i', '0')}: {dims('N', '1')}] = +(E[{at('i', 'j')}]){cons};")
    product = f"[{at('i', 'e')}: {dims('N', 'W')}] = +({{}}[{at('i', 'j')}] * V[{kv('j', 'e')}]){cons};"
    if spec.normalized:
        lines += ["A = E / Z;", "O" + product.format("A")]
    else:
        lines += ["O1" + product.format("E"), "O = O1 / Z;"]
    body = "\n".join(f"  {ln}" for ln in lines)
    return f"function ({', '.join(ins)}) -> (O) {{\n{body}\n}}\n"


def inputs(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random normal Q, K, V (and a bias), in the spec's dtype."""
    rng = np.random.default_rng(seed)
    dt = _numpy_dtype(spec.dtype)
    b = spec.batch
    kb = b[:-1] if spec.shared_kv and b else b
    out = {
        "Q": rng.standard_normal((*b, spec.rows, spec.depth)),
        "K": rng.standard_normal((*kb, spec.keys, spec.depth)),
        "V": rng.standard_normal((*kb, spec.keys, spec.width)),
    }
    if spec.bias:
        out["Bias"] = rng.standard_normal((spec.rows, spec.keys))
    return {k: v.astype(dt) for k, v in out.items()}


def _numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # only where bfloat16 is asked for

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _scores(spec: Spec, ins: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 ``(x, keep, A)``: the exponent ``c * P`` of each (row, key), whether the key counts
    (the mask), and ``Σ_d |q_d k_d|``."""
    q, k = ins["Q"].astype(np.float64), _kv(spec, ins["K"])
    s = np.einsum("...id,...jd->...ij", q, k)
    a = np.einsum("...id,...jd->...ij", np.abs(q), np.abs(k))
    p = s * spec.scale if spec.scale_form == "score" else s
    if spec.bias:
        p = p + ins["Bias"].astype(np.float64)
    c = 1.0 if spec.scale_form == "score" else spec.c
    i = np.arange(spec.rows)[:, None]
    j = np.arange(spec.keys)[None, :]
    keep = np.broadcast_to(j <= i if spec.mask != "none" else np.ones_like(j <= i), p.shape)
    return c * p, keep, a


def _kv(spec: Spec, a: np.ndarray) -> np.ndarray:
    """K or V in float64 with the heads' axis they are shared over put back (size 1)."""
    a = a.astype(np.float64)
    return np.expand_dims(a, len(spec.batch) - 1) if spec.shared_kv and spec.batch else a


def reference(spec: Spec, ins: dict[str, np.ndarray]) -> np.ndarray:
    """The attention in float64 (NaN for a row with no key left)."""
    x, keep, _ = _scores(spec, ins)
    x = np.where(keep, x, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        top = x.max(axis=-1, keepdims=True)
        e = np.exp(x - top)
        return (e @ _kv(spec, ins["V"])) / e.sum(axis=-1, keepdims=True)


def tolerance(spec: Spec, ins: dict[str, np.ndarray]) -> float:
    """docs/semantics.md §8.7: the largest difference allowed between two computations of the
    spec's attention that each round in its dtype (unit roundoff ``u``) at most as the chain does:
    an exponent ``c * P`` is off by ``|c| (D u A + 4 u |P|)`` (the dot product of depth D, with A =
    Σ|q_d k_d|, then the score's and the shift's roundings), its exponential relatively by that
    plus ``4u``; a convex combination of V's rows with weights off by at most ``δ`` relatively is
    off by ``2δ max|v|``; the sums over ``N`` keys add ``N u max|v|`` each, the division ``u |O|``.
    Twice that (two computations), maximized over the keys that count (weight at least ``u``)."""
    u = UNIT_ROUNDOFF[spec.dtype]
    x, keep, a = _scores(spec, ins)
    c = 1.0 if spec.scale_form == "score" else abs(spec.c)  # the exponent's scale: x = c * P
    with np.errstate(invalid="ignore"):
        top = np.where(keep, x, -np.inf).max(axis=-1, keepdims=True)
        counts = keep & (np.exp(x - top) >= u)
    if not counts.any():
        return 0.0
    p = np.abs(x[counts]).max() / c if c else 0.0  # |P|
    delta = abs(spec.scale) * spec.depth * u * a[counts].max() + c * 4 * u * p + 4 * u
    vmax = float(np.abs(ins["V"].astype(np.float64)).max()) if ins["V"].size else 0.0
    return 2 * (vmax * (2 * delta + 2 * spec.keys * u) + 2 * u * vmax)


@st.composite
def cases(draw, dtypes=("float32", "float16"), most: int = 48) -> tuple[Spec, str, dict]:
    """``(spec, source, inputs)``: a drawn attention variant with random normal inputs."""
    nb = draw(st.integers(0, 2))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=nb, max_size=nb)))
    rows = draw(st.integers(1, most))
    cross = draw(st.booleans())
    mask = draw(st.sampled_from(["none", "constraint", "cond"]))
    spec = Spec(
        batch=batch, rows=rows,
        keys=draw(st.integers(1, most)) if cross and mask == "none" else rows,
        depth=draw(st.integers(1, 24)), width=draw(st.integers(1, 12)),
        scale=draw(st.sampled_from([1.0, 0.5, 0.125, 0.3, 2.0])),
        scale_form=draw(st.sampled_from(["mul", "div", "score"])),
        mask=mask, bias=draw(st.booleans()), normalized=draw(st.booleans()), shared_kv=draw(st.booleans()),
        dtype=draw(st.sampled_from(dtypes)),
    )
    return spec, source(spec), inputs(spec, draw(st.integers(0, 2**16)))


def assert_close(spec: Spec, ins: dict, got: np.ndarray, want: np.ndarray) -> None:
    """``got`` within ``tolerance`` of ``want`` (both NaN at the same places: rows with no key)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), "NaN at other places (rows with no key left)"
    tol = tolerance(spec, ins)
    err = float(np.abs(got - want)[~nan].max()) if (~nan).any() else 0.0
    assert err <= tol, f"max difference {err:.3g} over the tolerance {tol:.3g} ({spec})"


def gradient_source(spec: Spec) -> str:
    """The gradient program ``tile.autodiff`` derives for ``spec``'s attention: inputs Q, K, V (a
    bias) and ``DO`` (the result's cotangent), outputs ``DQ``, ``DK``, ``DV`` (``DBias``)."""
    from tile.autodiff import gradient
    from tile.parser import parse
    from tile.printer import format_program

    ins = inputs(spec)
    g = gradient(parse(source(spec)), None, dtypes={k: _dtype_name(v) for k, v in ins.items()},
                 shapes={k: v.shape for k, v in ins.items()})
    assert g.cotangents == {"O": "DO"}, g.cotangents
    return format_program(g.program)


def _dtype_name(a: np.ndarray):
    from tile.dtypes import DType

    return DType.of(a.dtype)


def gradient_inputs(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """``inputs(spec, seed)`` and a random normal cotangent ``DO`` of the result's shape."""
    out = inputs(spec, seed)
    rng = np.random.default_rng(seed + 7919)
    out["DO"] = rng.standard_normal((*spec.batch, spec.rows, spec.width)).astype(out["Q"].dtype)
    return out


def _backward(spec: Spec, ins: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float64 quantities of the backward, heads' axes kept (K, V broadcast): the weights ``w``,
    ``g = dP - Δ`` (``dP = DO · V_j``, ``Δ = DO · O``), ``dS``, and the magnitudes the bound uses."""
    x, keep, a = _scores(spec, ins)
    v, k = _kv(spec, ins["V"]), _kv(spec, ins["K"])
    q, do = ins["Q"].astype(np.float64), ins["DO"].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        xm = np.where(keep, x, -np.inf)
        top = xm.max(axis=-1, keepdims=True)
        e = np.where(keep, np.exp(xm - top), 0.0)
        w = e / e.sum(axis=-1, keepdims=True)
    o = w @ v
    dp = np.einsum("...ie,...je->...ij", do, v)
    delta = (do * o).sum(axis=-1, keepdims=True)
    g = np.where(keep, dp - delta, 0.0)
    c = spec.scale if spec.scale_form == "score" else spec.c  # dS = c dX: x = c * S (+ c * bias)
    return {"x": x, "keep": keep, "a": a, "w": w, "o": o, "dp": dp, "delta": delta, "g": g, "ds": c * w * g,
            "c": c, "q": q, "k": k, "v": v, "do": do, "top": top}


def _unbroadcast(spec: Spec, a: np.ndarray) -> np.ndarray:
    """Sums K's or V's gradient over the heads axis they are shared across."""
    return a.sum(axis=len(spec.batch) - 1) if spec.shared_kv and spec.batch else a


def gradient_reference(spec: Spec, ins: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 gradients ``DQ``, ``DK``, ``DV`` (and ``DBias``) of ``sum(DO * O)``."""
    b = _backward(spec, ins)
    out = {"DQ": b["ds"] @ b["k"],
           "DK": _unbroadcast(spec, np.einsum("...ij,...id->...jd", b["ds"], b["q"])),
           "DV": _unbroadcast(spec, np.einsum("...ij,...ie->...je", b["w"], b["do"]))}
    if spec.bias:
        dx = b["w"] * b["g"] * (1.0 if spec.scale_form == "score" else spec.c)
        out["DBias"] = dx.reshape(-1, spec.rows, spec.keys).sum(axis=0)
    return out


def gradient_tolerance(spec: Spec, ins: dict[str, np.ndarray]) -> dict[str, float]:
    """docs/semantics.md §8.7: the largest difference allowed between two computations of the
    gradients ``DQ``, ``DK``, ``DV`` that each round at most as the derived chain does, recomputing
    the weights ``w = exp(x - max x) / Z`` or not. The data type's unit roundoff ``u`` rounds the
    scores (``δ``, the exponent's error, is the forward's) and the results; the rest is float32
    (``v = 2^-24``: the derived program keeps the weights and the cotangents in float32 for half
    types too, and the fused kernels sum in float32), but for ``dP = DO · V``, rounded to ``u``,
    and, for half types, the weights and ``dS`` once more by ``u``: a fused kernel issuing its
    products on a matrix unit rounds them to the operands' type first (``u_op``).
    Per (row i, key j): the weight's relative error ``ω = expm1(δ) + ζ + v``, with ``ζ = Σ_j w
    expm1(δ) + (N + 1) v`` the sum Z's; ``O_e`` off by ``Σ_j w (ω + (N + 2) v) |V_je|``; ``Δ = DO ·
    O`` (or ``Σ_j w DO · V_j``) by ``Σ_e |DO_e| (err(O_e) + (W + 2) v Σ_j w |V_je|)``; ``g = dP -
    Δ`` by ``(W + 2) u Σ_e |DO V| + err(Δ) + v |g|``; ``dS = c w g`` by ``|c| w (ω |g| + err(g)) +
    2 v |dS|``, plus, where a key's exponent is within ``2δ`` of its row's max (the chain's ``S ==
    Mx ? DMx_1`` may pick it), ``T = Σ_j err(dS) + (N + 1) v Σ_j |dS|`` (``DMx_1``, a row sum of
    dS, is 0 in reals); each gradient a sum over the keys (``DQ``) or rows (``DK``, ``DV``) of those
    with ``(N + 1) v`` its own rounding, then ``u`` the result's. Twice that (two computations),
    the largest element."""
    u, v = UNIT_ROUNDOFF[spec.dtype], UNIT_ROUNDOFF["float32"]
    u_dp = u if spec.normalized else v
    u_op = 0.0 if spec.dtype == "float32" else u  # weights and dS rounded to be a product's operands
    b = _backward(spec, ins)
    w, g, ds, keep, c = b["w"], b["g"], b["ds"], b["keep"], abs(b["c"])
    n, width = spec.keys, spec.width
    with np.errstate(invalid="ignore"):
        delta = np.where(keep, abs(spec.scale) * spec.depth * u * b["a"] + 4 * u * (np.abs(b["x"]) + 1), 0.0)
        eps = np.expm1(delta)
    omega = eps + (w * eps).sum(axis=-1, keepdims=True) + (n + 2) * v + u_op
    absdo, absv = np.abs(b["do"]), np.abs(b["v"])
    wv = np.einsum("...ij,...je->...ie", w, absv)  # Σ_j w |V_je|
    err_o = np.einsum("...ij,...je->...ie", w * (omega + (n + 2) * v), absv)
    err_delta = (absdo * (err_o + (width + 2) * v * wv)).sum(axis=-1, keepdims=True)
    err_g = (width + 2) * u_dp * np.einsum("...ie,...je->...ij", absdo, absv) + err_delta + v * np.abs(g)
    absds = np.abs(ds)
    err_ds = c * w * (omega * np.abs(g) + err_g) + (2 * v + u_op) * absds
    ties = keep & (b["top"] - b["x"] <= 2 * delta)
    t = err_ds.sum(axis=-1, keepdims=True) + (n + 1) * v * absds.sum(axis=-1, keepdims=True)
    err_ds = err_ds + np.where(ties, t, 0.0)
    kmax, qmax = np.abs(b["k"]).max(axis=-1), np.abs(b["q"]).max(axis=-1)  # per key, per row
    domax = absdo.max(axis=-1)
    rows = spec.rows * (spec.batch[-1] if spec.shared_kv and spec.batch else 1)
    dq = ((err_ds + (n + 1) * v * absds) * kmax[..., None, :]).sum(axis=-1)
    dk = _unbroadcast(spec, ((err_ds + (rows + 1) * v * absds) * qmax[..., :, None]).sum(axis=-2))
    dv = _unbroadcast(spec, (w * (omega + (rows + 1) * v) * domax[..., :, None]).sum(axis=-2))
    ref = gradient_reference(spec, ins)
    out = {}
    for name, err in (("DQ", dq), ("DK", dk), ("DV", dv)):
        own = u * float(np.abs(ref[name]).max()) if ref[name].size else 0.0  # the result's rounding
        out[name] = 2 * (float(err.max()) + own) if err.size else 0.0
    return out


def assert_gradients_close(spec: Spec, ins: dict, got: dict, want: dict) -> None:
    """Each of ``DQ``, ``DK``, ``DV`` in ``got`` within ``gradient_tolerance`` of ``want``."""
    tol = gradient_tolerance(spec, ins)
    for name, bound in tol.items():
        a, b = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        err = float(np.abs(a - b).max()) if a.size else 0.0
        assert err <= bound, f"{name}: max difference {err:.3g} over the tolerance {bound:.3g} ({spec})"


__all__ = ["Spec", "assert_close", "assert_gradients_close", "cases", "gradient_inputs", "gradient_reference",
           "gradient_source", "gradient_tolerance", "inputs", "reference", "source", "tolerance"]
