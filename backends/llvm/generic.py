"""Shape-generic kernels: one build per bucket, its extents read at run time (the ``generic`` setting).

A *bucket* is the set of kernels equal up to their integers (``symbolic.erased``) with the same
buffers, dtypes, schedule and code generator options: the same program at another sequence length
usually lands in the same bucket, as long as the optimizer makes the same decisions. The first
kernel of a bucket is built specialized, as without the setting, and remembered. A later kernel of
the bucket that differs in some integers makes a *template* (``symbolic.unify``: those integers
become slots), built once as a generic kernel whose slots are loads from an extents array passed
after its buffers; every later kernel that is an instance of the template only has its integers
read off (``symbolic.bind``; ``symbolic.matches`` on the integers the bucket key's walk collected):
no code is generated. An instance that differs in an integer the
template fixed widens the template (a new build); a bucket stops widening after ``MAX_BUILDS``.

Which kernels: those the specialized build would emit as plain loops (no optimizer GEMM nest, no
fused epilogue, no micro-kernel match; a zero fill the next kernel's micro-kernel may take over is
generic only with that kernel): elementwise chains, reductions, softmax rows, the contractions the
micro-kernel does not take; and the products the micro-kernel takes at kernel level (a flat GEMM,
an optimizer nest read back flat, its fused epilogue too): those run ``generic_tiles``' micro-kernel
with the bucket's register tile and K blocks, its counts and edges at run time, the bucket's
thread split, and the zero fill before it taken over when it covers its output; a flat kernel of at
most ``gemm_tile.GENERIC_FLAT_POINTS`` points (a GEMM ``gemm_tile`` left flat under this setting)
runs as plain loops, a product too (``_short_flat``). ``generic_products``
instead runs products as plain loops (with ``tiled=False``: the previous form, one build for all
lengths but slow at large sizes). A plain-loop generic kernel sums as written (no ``partials``
blocks, which depend on the extents), except a row reduction along a contiguous index, which runs
``rowreduce``'s vector loop as the specialized kernel does, its row length fixed or at run time;
LLVM may still vectorize a float sum (reassociation, as docs/semantics.md §8.3 allows, never under
``strict``). Any code generator decision that would
read a slot as a number raises ``symbolic.SlotUsed``: that bucket is built specialized instead.
Results are those of the kernel the template is instantiated at, only the integers come at run
time: a generic kernel is exact wherever the specialized one is.

Generic modules are kept per process (``REGISTRY``) and their object code in the disk cache, keyed
by their IR text; a library's generic functions are named in its program-cache snapshot
(``Use.saved``) and loaded again from the object cache by ``restored``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import replace

import llvmlite.binding as llvm
from llvmlite import ir

from backends.hal import KernelInfo
from backends.llvm import generic_tiles, symbolic
from backends.llvm.cache import ObjectCache, runtime_key
from backends.llvm.codegen import RUNTIME_LOCALS, KernelCodegen, _zero_fill_of, buffer_dtypes, units
from backends.llvm.generic_forms import REGISTRY, Bucket, Form, Use, alias, named, scheduled, shared
from backends.llvm.host import target_machine
from backends.llvm.microkernel import kernel_match
from backends.llvm.scalars import Emitter
from backends.llvm.schedule import Schedule
from stripe.ir import Block, RefDir
from stripe.passes.gemm_tile import GENERIC_FLAT_POINTS

MAX_BUILDS = 4  # generic builds per bucket before it stays specialized


def restored(saved: list, triple: str, layout: str, cpu: str, features: str, enabled: bool) -> Use | None:
    """A ``Use`` from ``Use.saved``, its function loaded from the object cache (once per module and
    process: ``LOADED``); None when the entry is missing."""
    (key, symbol), (extents, stack, schedule, fresh, skip) = saved[:2], saved[2:]
    if key == NOOP:
        address, keep = _noop(triple, layout, cpu, features)
        return Use(address, list(extents), stack, False, schedule, keep, fresh, skip, (key, symbol))
    with REGISTRY.lock:
        keep = LOADED.get(key)
        if keep is None:
            entry = ObjectCache(key, enabled).load()
            if entry is None:
                return None
            mod = llvm.parse_assembly(f'target triple = "{triple}"\ntarget datalayout = "{layout}"\n')
            engine = llvm.create_mcjit_compiler(mod, target_machine(cpu, features))
            engine.add_object_file(llvm.ObjectFileRef.from_data(entry))
            engine.finalize_object()
            keep = LOADED[key] = (engine, mod)
    address = keep[0].get_function_address(symbol)
    if not address:
        return None
    return Use(address, list(extents), stack, False, schedule, keep, fresh, skip, (key, symbol))


def _noop(triple: str, layout: str, cpu: str, features: str) -> tuple[int, tuple]:
    """The address and engine of a kernel that is never launched (a zero fill a generic product
    took over, which may be of a fixed size, so never generic itself): a function doing nothing,
    built once per process."""
    with REGISTRY.lock:
        keep = LOADED.get(NOOP)
        if keep is None:
            text = (f'target triple = "{triple}"\ntarget datalayout = "{layout}"\n'
                    f"define void @{NOOP}(ptr %0, i64 %1, i64 %2) {{\n  ret void\n}}\n")
            mod = llvm.parse_assembly(text)
            engine = llvm.create_mcjit_compiler(mod, target_machine(cpu, features))
            engine.finalize_object()
            keep = LOADED[NOOP] = (engine, mod)
    return keep[0].get_function_address(NOOP), keep


NOOP = "tile_noop"  # ``_noop``'s function (and its ``LOADED`` key)
LOADED: dict[str, tuple] = {}  # generic modules loaded from the object cache by ``restored``, by key


def eligible(info: KernelInfo, sched: Schedule, code: KernelInfo, blocks, epilogue, vector, dts,
             products: bool = False) -> bool:
    """Whether kernel ``info`` may be a generic plain loop (see the module docstring; ``products``:
    the ``generic_products`` setting, the contractions the micro-kernel would take too)."""
    block = info.block
    if not isinstance(block, Block) or code is not info or blocks is not None or epilogue is not None:
        return False
    if not vector.vector_bytes or products:
        return True
    pos = sched.split_index if sched.order and sched.split else None
    return not _products(block, pos, vector, dts)


def _products(block: Block, pos, vector, dts) -> bool:
    """Whether the micro-kernel would take ``block`` or a block inside it (then it stays
    specialized: its tiles and panels are sized from the extents)."""
    dims = {r.into: r.shape.dims for r in block.refs}
    ref_dts = {r.into: dts.get(r.source, r.shape.dtype) for r in block.refs}
    try:
        if kernel_match(None, block, dims, ref_dts, pos, vector, None, None) is not None:
            return True
    except Exception:  # noqa: BLE001 - the micro-kernel's analysis refused it: a plain loop then
        pass
    return any(_products(s, None, vector, dts) for s in block.stmts if isinstance(s, Block))


def bucket_key(info: KernelInfo, sched: Schedule, dts: dict, meta: str, text: str | None = None) -> str:
    """The bucket of kernel ``info`` (``text``: ``symbolic.erased`` of its block where known). Its
    schedule's loop order and split index are not in it: they follow the extents (``schedule.plan``
    splits the owned index of largest stride whose range is at least twice the threads: P V's rows
    from S = 4, its columns below), so a bucket runs every kernel in the order of the kernel its
    form was built from (``generic_forms.scheduled``); which indexes are owned (may be split) is."""
    text = symbolic.erased(info.block) if text is None else text
    return "\n".join([text, repr(info.buffers), repr(sorted(dts.items())), repr((sched.split, sched.owned)),
                      meta])


def assign(kernels, plan, settings: dict, cpu: str, features: str) -> tuple[dict[int, Use], set[int]]:
    """The kernels of ``plan`` (``device._Plan``) that run generic functions, building the
    templates this program completes (one module for all of them); and the products built
    specialized (their bucket's first kernel, one of another structure) of at most ``SMALL_FIRST``
    points: those are built as plain loops (``device``), a few hundred IR lines where the
    micro-kernel's tiles took thousands (the attention's fused Q K^T + R nest at S = 24: 5,342)."""
    vector = replace(plan.vector, vector_bytes=0)  # plain loops: no micro-kernel reads an extent
    opt = int(settings.get("opt", 3))
    unroll = bool(settings.get("unroll", opt >= 2))
    meta = repr((plan.vector, plan.f16c, plan.triple, opt, unroll))
    # products as micro-kernels with run-time extents (``generic_tiles``), unless ``generic_products``
    # asks for plain loops
    tiles = bool(plan.vector.vector_bytes) and not settings.get("generic_products")
    paired = [u for u in units(plan.code) if len(u) > 1]
    uses: dict[int, Use] = {}
    todo: list[tuple[int, str, Block, Schedule]] = []
    plain: set[int] = set()
    flats: list[int] = []  # short flat kernels: plain loops, their products' too (``_short_flat``)
    with REGISTRY.lock:
        for j in sorted(plan.only):
            info = kernels[j]
            dts = buffer_dtypes(info, plan.dtypes)
            sched = plan.schedules[j]
            fill = _zero_fill_of(plan.code[j - 1], plan.code[j]) if (j - 1, j) in paired else 0
            short = tiles and _short_flat(j, plan)
            if short:
                flats.append(j)
            elif tiles and _product(j, kernels, plan, dts, meta, uses, todo, fill):
                short = _points(plan.code[j].block) <= SMALL_FIRST  # the flat GEMM's points
                if short and j not in uses and all(t[0] != j for t in todo):
                    plain.add(j)
                continue
            loops = bool(settings.get("generic_products")) or short or (
                tiles and _points(info.block) <= SMALL_LOOPS)
            code, blocks = plan.code[j], plan.blocks[j]
            if loops and _refused_nest(info, code, blocks, plan.epilogues[j]):
                info, code, blocks = code, code, None  # its flat GEMM, as plain loops (``_refused_nest``)
            if not eligible(info, sched, code, blocks, plan.epilogues[j], plan.vector, dts,
                            loops) or _local_bytes(info.block) > RUNTIME_LOCALS:
                continue
            text, ints = symbolic.flat(info.block)
            if short:
                _remember_short(j, plan, dts, meta, text, fill)
            key = bucket_key(info, sched, dts, meta, text)
            bucket = REGISTRY.buckets.setdefault(key, Bucket())
            if bucket.refused:
                continue
            if bucket.form is not None:
                values = symbolic.matches(bucket.form.pattern, ints)
                if values is not None:
                    form = bucket.form
                    uses[j] = Use(form.address, values, form.stack, False, scheduled(form, sched),
                                  form.engine, where=form.where)
                    continue
            akey = alias(key, info.block, info.buffers, dts, repr(sched.split) + meta, sched.owned)
            form, values = shared(akey, ints)
            if form is not None:  # another program's kernel of this bucket up to names built it
                uses[j] = Use(form.address, values, form.stack, False, scheduled(form, sched), form.engine,
                              where=form.where)
                continue
            if bucket.first is None:
                bucket.first = info.block
                continue
            if bucket.builds >= MAX_BUILDS:
                bucket.refused = f"{MAX_BUILDS} generic builds"
                continue
            base = bucket.form.template if bucket.form is not None else bucket.first
            template = symbolic.unify(base, info.block)
            if template is None or symbolic.slots(template) == 0:
                continue  # the same integers (or another structure): built specialized
            todo.append((j, key, template, sched, None, False))
        if todo:
            uses.update(_build(kernels, plan, todo, vector, opt, unroll, settings, cpu, features))
    for j in flats:  # built specialized (a bucket's first): a product as plain loops all the same
        dts = buffer_dtypes(kernels[j], plan.dtypes)
        if j not in uses and _takes(plan.code[j].block, plan.schedules[j], dts, plan.vector, None, None):
            plain.add(j)
    for pair in paired:  # ``codegen.generate`` builds a zero fill with the next kernel: both or neither
        fill, product = pair
        if product in uses and uses[product].fresh:  # the fill is not run: a function that does nothing
            address, keep = _noop(plan.triple, plan.layout, cpu, features)
            uses[fill] = Use(address, [], 0, False, plan.schedules[fill], keep, skip=True, where=(NOOP, NOOP))
        if not all(k in uses for k in pair):
            for k in pair:
                uses.pop(k, None)
        elif uses[pair[1]].fresh:
            uses[pair[0]] = replace(uses[pair[0]], skip=True)
    return uses, plain


def _product(j: int, kernels, plan, dts: dict, meta: str, uses: dict, todo: list, fill: int) -> bool:
    """Whether kernel ``j`` is a product the micro-kernel takes at kernel level (a flat GEMM, an
    optimizer nest read back by ``match.from_nest``, with its fused epilogue): then it binds to
    its bucket's form, is remembered, or goes to ``todo`` (``generic_tiles``), and True; False for
    the others (and a refused bucket's: plain loops may be generic). Its bucket keeps one thread
    split, the index of the kernel that built the form: the split between rows and panels
    (``match.panel_split``) changes with the panel count, not the code's shape. ``fill``: the
    element count of the zero fill before it (``codegen.units``), or 0."""
    code, sched, epi = plan.code[j], plan.schedules[j], plan.epilogues[j]
    block = code.block
    if not sched.order or not isinstance(block, Block):
        return False
    fill = 0 if epi is not None else fill
    sig = generic_tiles.signature(block, dts, sched.split_index, fill, epi)
    if sig is None:
        return False
    whole = (block, _canonical(epi))  # what the template covers: the flat GEMM and its fused epilogue
    text, ints = symbolic.flat(whole)
    key = "\n".join(["tiles", text, repr(code.buffers), repr(sorted(dts.items())), meta])
    bucket = REGISTRY.buckets.get(key)
    form = bucket.form if bucket is not None and not bucket.refused else None
    if form is not None and sched.split_index == form.schedule.split_index and sig[1] == form.signature:
        values = symbolic.matches(form.pattern, ints)
        if values is not None:  # an instance of the form (its tiles take any extents): bound at once,
            # without asking the micro-kernel whether it takes this one (``_takes``: 0.6 ms a length)
            uses[j] = Use(form.address, values, form.stack, False, sched, form.engine, sig[1][-1],
                          where=form.where)
            return True
    akey = alias(key, whole, code.buffers, dts, meta)
    mine = named(sig[1], REGISTRY.aliases[key][1])
    form, values = shared(akey, ints, lambda f: f.schedule.split_index == sched.split_index
                          and named(f.signature, f.names) == mine)
    if form is not None:  # another program's product of this bucket up to names built it
        uses[j] = Use(form.address, values, form.stack, False, sched, form.engine, sig[1][-1],
                      where=form.where)
        return True
    if not _takes(block, sched, dts, plan.vector, plan.blocks[j], epi):
        return False
    bucket = REGISTRY.buckets.setdefault(key, Bucket())
    form = bucket.form
    if bucket.refused:
        return False
    if form is not None:
        address, stack, want, where = form.address, form.stack, form.signature, form.where
        keep = form.engine
        values = symbolic.matches(form.pattern, ints)
        if sched.split_index in form.other:  # this kernel's own split: the form's other function
            address, stack, want, keep, where = form.other[sched.split_index]
        elif sched.split_index != form.schedule.split_index:
            if values is not None and sig[1][:-2] == want[:-2] and _points(block) > SMALL_SPLIT:
                todo.append((j, key, form.template, sched, sig, True))  # the other split: built now
                return True
            # the form's split index, this kernel's extents (a widening below builds under it)
            grain = form.panel if form.schedule.split_index == form.signature[1] else 1
            sched = replace(form.schedule, ranges=sched.ranges, grain=grain)
            sig = generic_tiles.signature(block, dts, sched.split_index, fill, epi)
        if sig is None or sig[1] != want:
            return True  # another structure at this length: specialized
        if values is not None:
            uses[j] = Use(address, values, stack, False, sched, keep, sig[1][-1], where=where)
            return True
    if bucket.first is None:
        bucket.first, bucket.fill = whole, fill
        return True
    if bucket.builds >= MAX_BUILDS:
        bucket.refused = f"{MAX_BUILDS} generic builds"
        return True
    base = form.template if form is not None else bucket.first
    pos, (fb, fe) = sched.split_index, bucket.first
    first = generic_tiles.signature(fb, dts, pos, bucket.fill, fe) if form is None else None
    template = symbolic.unify(base, whole)
    if template is None or symbolic.slots(template) == 0 or (first is not None and first[1] != sig[1]):
        if bucket.short and form is None:  # no template with a short length's kernel: this one is first
            bucket.first, bucket.fill, bucket.short = whole, fill, False
        return True
    todo.append((j, key, template, sched, sig, False))
    return True


def _remember_short(j: int, plan, dts: dict, meta: str, text: str, fill: int) -> None:
    """Offer the short flat kernel ``j`` (``_short_flat``; ``text``: ``symbolic.flat``'s of its block)
    to the product bucket its longer lengths fall in (``_product``: under this setting ``gemm_tile``
    leaves a GEMM without a fused epilogue flat at every size, so the same block), once per
    bucket: the first kernel of a bucket that has none, when the micro-kernel takes it. The first
    length past the short ones then builds the template at once, not a plain first kernel (the
    attention's P V and the backward's four products at S = 72: 0.1-0.2 s, and a generation each)."""
    code, sched = plan.code[j], plan.schedules[j]
    key = "\n".join(["tiles", f"({text},None,)", repr(code.buffers), repr(sorted(dts.items())), meta])
    if key in REGISTRY.tried or key in REGISTRY.buckets:
        return
    block = code.block
    if not sched.order or generic_tiles.signature(block, dts, sched.split_index, fill, None) is None:
        REGISTRY.tried.add(key)  # no product
    elif _takes(block, sched, dts, plan.vector, None, None):  # (else asked again at the next length:
        REGISTRY.buckets[key] = Bucket(first=(block, None), fill=fill, short=True)  # S = 3's dO V^T)


def _short_flat(j: int, plan) -> bool:
    """Whether kernel ``j`` is flat (no optimizer nest, no fused epilogue: ``gemm_tile`` leaves a GEMM
    of at most ``GENERIC_FLAT_POINTS`` points flat under this setting) and that short: it runs
    as plain loops with run-time extents, a product too (a few microseconds slower than the
    micro-kernel at these sizes), so one template serves every short length; the micro-kernel's
    generic products (``_product``) start above it."""
    code = plan.code[j]
    return (plan.blocks[j] is None and plan.epilogues[j] is None and isinstance(code.block, Block)
            and _points(code.block) <= GENERIC_FLAT_POINTS)


def _refused_nest(info: KernelInfo, code: KernelInfo, blocks, epilogue) -> bool:
    """Whether kernel ``info`` is an optimizer nest (``match.from_nest``: ``code`` its flat GEMM,
    ``blocks`` its tiles) without a fused epilogue that the micro-kernel refused (``_product``
    returned False: a gathered operand it would not pack, at short lengths). The specialized build
    then runs the flat GEMM as plain loops (``codegen.generate``), so its generic form is those
    plain loops, one build for every length the micro-kernel refuses (a backward's ``dO V^T`` at
    S = 4..23: a specialized build each before)."""
    return code is not info and blocks is not None and epilogue is None and isinstance(code.block, Block)


ROWS_THREADS = 4  # with at most this many threads a product under this setting splits its rows, never
# its panels (``device._plan`` skips ``match.panel_split``): panels pay with many threads, each of
# which would pack every panel of B (K x N) for its rows, but with a few threads that packing is a
# small part of a thread's M x N x K / threads, and the split over panels flips with the panel
# count (two panels on two threads: panels; three: rows), so a bucket needed a function of each
# split (the attention at S = 80 and 136; 256^3 ran 0.98 of specialized on rows, 512^3 1.09)
SMALL_FIRST = 1 << 17  # a product of at most this many points built specialized runs plain loops
SMALL_SPLIT = 1 << 15  # a product of at most this many points runs under its bucket's thread split
# when its own differs (microseconds either way; its own split's function is built for a larger one)
SMALL_LOOPS = 1 << 15  # a kernel of at most this many points whose products are nested blocks (no
# kernel-level micro-kernel: a fused kernel the optimizer did not tile, at short lengths) is generic
# as plain loops; a larger instance of its bucket stays specialized


def _points(block: Block) -> int:
    """The points ``block`` runs, its nested blocks' included."""
    inner = sum(_points(s) for s in block.stmts if isinstance(s, Block))
    return math.prod(ix.range for ix in block.idxs) * max(1, inner)


def _local_bytes(block: Block) -> int:
    """The bytes of ``block``'s per-point locals, its nested blocks' included (a generic kernel
    allocates those of run-time sizes for ``RUNTIME_LOCALS``: ``codegen.run_time_local``)."""
    out = 0
    for r in block.refs:
        if r.dir is RefDir.NONE and r.from_ is None:
            extent = 1 + sum((d.size - 1) * d.stride for d in r.shape.dims)
            out += max(extent, 1) * r.shape.dtype.numpy.itemsize
    return out + sum(_local_bytes(s) for s in block.stmts if isinstance(s, Block))


def _canonical(epi):
    """``epi`` (a ``tile_epilogue.Epilogue``) with its accumulator's sizes 1, and its strides 1 where
    its accesses are constant: they are the nest's tile (32 at S = 25, 64 at 33; its N tile the
    row stride, 128 up to S = 128 and 256 past it), which the micro-kernel's epilogue never reads
    (it reads its own scratch tile at the element's position, ``TileEpilogue``), and would widen a
    template for nothing."""
    if epi is None:
        return None
    acc = epi.acc
    fixed = all(a.is_constant for a in acc.access)
    dims = tuple(replace(d, size=1, stride=1 if fixed else d.stride) for d in acc.shape.dims)
    one = replace(acc, shape=replace(acc.shape, dims=dims))
    refs = tuple(one if r.into == acc.into else r for r in epi.block.refs)
    return replace(epi, block=replace(epi.block, refs=refs), acc=one)


def _takes(block: Block, sched: Schedule, dts: dict, vector, blocks, epi) -> bool:
    """Whether the specialized build runs ``block`` as a micro-kernel (``microkernel.kernel_match``;
    else its plain loops may be generic)."""
    dims = {r.into: r.shape.dims for r in block.refs}
    ref_dts = {r.into: dts.get(r.source, r.shape.dtype) for r in block.refs}
    try:
        return kernel_match(None, block, dims, ref_dts, sched.split_index, vector, blocks, epi) is not None
    except Exception:  # noqa: BLE001 - the micro-kernel's analysis refused it: a plain loop then
        return False


def _build(kernels, plan, todo, vector, opt: int, unroll: bool, settings, cpu, features) -> dict[int, Use]:
    """Generate each template in its own module (a refused one leaves nothing behind), link them
    into one, optimize and load it; record the forms."""
    texts, made = [], []
    for j, key, template, sched, sig, variant in todo:
        info = plan.code[j]  # a plain loop's too: a refused nest's flat GEMM (``assign``)
        module = ir.Module(name="tile_generic")
        module.triple, module.data_layout = plan.triple, plan.layout
        em = Emitter(module, plan.f16c)
        em.inline_math = vector.reassoc
        em.strict = not em.inline_math
        em.stack_bytes = 0
        n = symbolic.slots(template)
        symbol = f"tile_g{len(made)}"  # this module's: the text (the disk key) is the same in any process
        generic_info = replace(info, name=symbol, block=template if sig is None else template[0])
        bucket = REGISTRY.buckets[key]
        try:
            if sig is None:
                cg = KernelCodegen(em, 0, generic_info, sched, buffer_dtypes(info, plan.dtypes),
                                   vector, slots=n)
                cg.row_bytes = plan.vector.vector_bytes  # rows as vectors (``rowreduce``), as specialized
            else:  # a product: the micro-kernel with the bucket's tiles, under each thread split
                block, epi = template
                tiles = generic_tiles.plan(block, sig[0], plan.vector, epi is None or epi.partials)
                panel = tiles.nv * tiles.width
                cg = generic_tiles.GenericProductCodegen(
                    em, 0, generic_info, sched, buffer_dtypes(info, plan.dtypes), plan.vector, slots=n,
                    epilogue=epi, shape=sig[0], tiles=tiles, fresh=sig[1][-1])
            cg.symbol = symbol
            cg.build()
        except symbolic.SlotUsed as e:
            bucket.refused = str(e)
            continue
        REGISTRY.generated += 1
        texts.append(str(module))
        if sig is None:
            panel = 1
        made.append((j, key, template, n, symbol, em.stack_bytes, sched, sig, panel, variant))
    if not made:
        return {}
    text = "\n".join(texts)
    cache = ObjectCache(runtime_key(f"generic opt={opt} unroll={unroll}\n{text}", cpu, features),
                        bool(settings.get("cache", True)))
    entry = cache.load()
    tm = target_machine(cpu, features)  # its own: an engine owns (and frees) its target machine
    if entry is not None:
        mod = llvm.parse_assembly(f'target triple = "{plan.triple}"\ntarget datalayout = "{plan.layout}"\n')
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.add_object_file(llvm.ObjectFileRef.from_data(entry))
    else:
        mod = llvm.parse_assembly(texts[0])
        for t in texts[1:]:
            mod.link_in(llvm.parse_assembly(t))
        mod.verify()
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        pto.loop_vectorization = opt >= 2
        pto.slp_vectorization = opt >= 2
        pto.loop_unrolling = unroll
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.set_object_cache(lambda _m, data: cache.store(data), lambda _m: None)
    engine.finalize_object()
    keep = (engine, mod)
    uses = {}
    for j, key, template, n, symbol, stack, sched, sig, panel, variant in made:
        address = engine.get_function_address(symbol)
        bucket = REGISTRY.buckets[key]
        if variant:  # a product's form under another thread split (``_product``)
            fresh = bool(sig[1][-1])
            where = (cache.key, symbol)
            bucket.form.other[sched.split_index] = (address, stack, sig[1], keep, where)
            values = symbolic.bind(template, (plan.code[j].block, _canonical(plan.epilogues[j])))
            uses[j] = Use(address, values, stack, True, sched, keep, fresh, where=where)
            continue
        signature = sig[1] if sig else None
        bucket.form = Form(template, n, address, stack, keep, (cache.key, symbol), sched, signature, panel)
        if key in REGISTRY.aliases:  # (the kernels of its bucket up to names in other programs too)
            akey, bucket.form.names = REGISTRY.aliases[key]
            REGISTRY.shared.setdefault(akey, []).append(bucket.form)
        bucket.builds += 1
        whole = plan.code[j].block if sig is None else (plan.code[j].block, _canonical(plan.epilogues[j]))
        values = symbolic.bind(template, whole)
        assert values is not None and len(values) == n, "a template binds the kernel it was made from"
        uses[j] = Use(address, values, stack, True, sched, keep, bool(sig and sig[1][-1]),
                      where=(cache.key, symbol))
    return uses


def extents_array(values: list[int]):
    """The extents a generic kernel reads (kept alive by the kernel that passes it)."""
    return (ctypes.c_int64 * max(1, len(values)))(*values)
