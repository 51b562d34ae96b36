"""A GEMM on Hopper's warp-group products whose tiles the tensor memory accelerator (TMA) loads:
the kernel ``gemm_tile`` plans where the device launches kernels through CUDA's driver API with
more local memory than OpenCL gives (``launched.Launch``: its tiles, modes and memory) and its copies
feed the GEMM (``launched.feeds``: ``stripe.gemm.streams``; 16-bit operands also where the last tiles
overhang M, N or K, as long as those tiles fill every compute unit: the accelerator fills what a box
reaches past the tensor with zeros, which add nothing, and the stores are guarded).
``schedule.plan`` decides it (``kernel`` ``tma``, where
``schedule.tma_fits``; the tile order, the stages, the launch record) and ``render_tma`` prints it.

* **Warps.** ``tm / 16`` warps multiply (``wgmma``'s warp groups, as there: warp group
  ``w`` owns 64 rows, every column) and one more warp loads: its first lane issues, per K step,
  one ``cp.async.bulk.tensor`` of A's ``tm x kt`` tile and one per 64 columns of B's. The copies
  land in the unit's swizzled canonical layouts (128-byte swizzle: K steps of 128 bytes), the
  layouts ``wgmma``'s kernel stages by hand, so its descriptors read them unchanged.
* **Hand-over.** ``STAGES`` K steps in one block of dynamic local memory, each with two
  ``mbarrier``s: *full* (the loader announces the step's bytes; the copies complete it) and
  *empty* (one arrival per multiplying warp once the products that read it are done). The
  multiplying warps leave each step's products running while they wait for the next step's
  tiles, and release a step when the products after it have been issued and the older ones awaited
  (``wgmma.wait_group 1``). No barrier in the K loop.
* **Tiles.** Where the target knows its compute units (``PERSISTENT``), the kernel launches one
  work-group per unit (at most one per tile), and each loops over every ``units``-th tile from
  its own: the loading warp runs on into the next tile's K steps while the multiplying warps store
  the last one, and the stages' barrier phases run on over the tiles (``it``: K steps so far).
  Tiles are numbered down bands of ``BAND`` tile rows, so the work-groups running at once read
  fewer rows of A and columns of B, which stay in the L2 cache
  (figures: bench/RESULTS.md, "Figures moved from docstrings").
* **Stores.** Where ``tile_store.plan`` takes the output, each multiplying warp passes its rows
  through a ``__local`` region of its own after the stages (``Cs_at``; only where it costs no
  stage) and stores whole lines. Two teams of multiplying warps on alternate 128 x 128 tiles (a
  ping-pong, so one team's stores overlap the other's products) were slower than one team on
  256 x 128 (figures: bench/RESULTS.md, "Figures moved from docstrings").
* **3xtf32** (operands already split along 3K by ``backends.cuda.kmajor``, ``tma_fits`` only then:
  ``gemm_tile`` ranks launched tiles for such GEMMs only): each K step's products go into sums
  of their own (the first replacing them), which are awaited and added to the running sums with
  a float32 addition before the step's buffer is released: the unit's own additions round toward
  zero (``mma.sync``, 1024³: 1.0e-5 max relative error summed in the unit, 3.4e-7 folded). The two
  sets of sums need the fold tiles (``Launch.fold_tiles``: 128 x 128, two multiplying warp groups).
* **Tensor maps.** The kernel takes two more arguments after the buffers, ``tmap_a`` and
  ``tmap_b``: global addresses of the ``CUtensorMap``s the launcher encodes from the buffers'
  addresses (``launch["maps"]``: per map its buffer's parameter, dims innermost first, row
  stride in bytes, box, element type). ``launch["local_bytes"]`` is the dynamic local memory to
  launch with; the kernel reads its base from the PTX name ``DYNAMIC``, which
  ``backends.cuda.ptx`` declares.
"""

from __future__ import annotations

DYNAMIC = "tile_dynamic_local"  # the PTX name of a launched kernel's dynamic local memory
STAGES = 4  # K steps in flight at most (4 measured faster than 3: bench/RESULTS.md)
MAPS = ("tmap_a", "tmap_b")  # the tensor-map arguments, after the buffers
PERSISTENT = True  # one work-group per compute unit, each looping over tiles (``tiles``)
BAND = 4  # tile rows per band of the tile order (``tiles``)
