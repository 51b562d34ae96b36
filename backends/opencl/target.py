"""OpenCL C as a dialect of ``backends.clike``: the few places it differs from plain C.

Type names (``char`` .. ``ulong``), literal suffixes (``L``/``UL``), overloaded math built-ins
(``exp`` for float and double), bit casts (``as_uint``), float16 memory through the core functions
``vload_half``/``vstore_half_rte`` (single correct rounding, also from double), ``mad`` and
``native_*`` under ``fast_math`` only, and the ``__kernel`` signature: one work-item per ``gid``.
The file starts with ``FP_CONTRACT OFF`` (a separately rounded multiply and add must not become an
fma) and enables ``cl_khr_fp64`` when the program uses float64.
"""

from __future__ import annotations

from backends.clike.numbers import arg
from backends.clike.target import CTarget
from tile.dtypes import DType

_NATIVE = frozenset({"exp", "log", "sin", "cos", "tan", "sqrt"})


class OpenCLTarget(CTarget):
    name = "opencl"
    function_qualifier = ""
    workgroups = True
    TYPES = {
        DType.BOOL: "bool",
        DType.INT8: "char",
        DType.INT16: "short",
        DType.INT32: "int",
        DType.INT64: "long",
        DType.UINT8: "uchar",
        DType.UINT16: "ushort",
        DType.UINT32: "uint",
        DType.UINT64: "ulong",
        DType.FLOAT16: "float",
        DType.BFLOAT16: "float",
        DType.FLOAT32: "float",
        DType.FLOAT64: "double",
    }
    INT_SUFFIX = {DType.INT64: "L", DType.UINT64: "UL", DType.UINT32: "U"}

    def __init__(self, *args, half_extension: bool = False, contract: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.half_extension = half_extension  # the device has cl_khr_fp16 (pragma only)
        self.contract = contract
        self.launch_bytes = 0  # dynamic local memory of kernels launched through CUDA (0: none)

    def unit_emitter(self, g, ptrs: dict[str, str], tiles, unit: str, epilogue):
        """The kernel a vendor registered for the matrix unit the plan names (``vendors``: the
        matrix units an OpenCL config describes are a vendor's), or None: the portable one."""
        from backends.opencl import vendors

        return vendors.first("unit_emitter", self, g, ptrs, tiles, unit, epilogue)

    def half_mem_type(self) -> str:
        return "half"

    def load(self, ptr: str, off: str, dt: DType) -> str:
        if dt is DType.FLOAT16:
            self.note(dt)
            return f"vload_half({off}, {ptr})"
        return super().load(ptr, off, dt)

    def store(self, ptr: str, off: str, value: str, dt: DType) -> str:
        if dt is DType.FLOAT16:
            self.note(dt)
            return f"vstore_half_rte({value}, {off}, {ptr});"
        return super().store(ptr, off, value, dt)

    def math(self, fn: str, dt: DType, args: list[str]) -> str:
        return f"{fn}({', '.join(args)})"

    def native(self, fn: str, dt: DType, args: list[str]) -> str | None:
        return f"native_{fn}({', '.join(args)})" if fn in _NATIVE else None

    def mad(self, a: str, b: str, c: str, dt: DType) -> str | None:
        return f"mad({a}, {b}, {c})"

    def bits(self, x: str, dt: DType) -> str:
        return f"as_ulong({x})" if dt is DType.FLOAT64 else f"as_uint({x})"

    def float_of_bits(self, x: str) -> str:
        return f"as_float({x})"

    def helper_text(self, name: str) -> str | None:
        if name in ("tile_rh", "tile_rhd"):
            arg = "double" if name == "tile_rhd" else "float"
            return (
                f"float {name}({arg} x)\n{{\n    ushort h;\n    vstore_half_rte(x, 0, (__private half*)&h);\n"
                "    return vload_half(0, (__private const half*)&h);\n}"
            )
        return None

    def header(self) -> list[str]:
        lines = ["#pragma OPENCL FP_CONTRACT OFF"]
        if DType.FLOAT64 in self.uses and self.fp64:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        if DType.FLOAT16 in self.uses and self.half_extension:
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
        return lines

    def group_kernel(self, name: str, params: list[tuple[str, DType]], local: int, body: list[str],
                     plain: frozenset[str] = frozenset(), values: int = 0) -> str:
        args = ", ".join(
            [f"__global {self.mem(dt)}* {'' if p in plain else 'restrict '}{p}" for p, dt in params]
            + [f"const long {arg(k)}" for k in range(values)]  # (a shape-generic kernel's: ``kernel``)
        )
        head = [f"__kernel __attribute__((reqd_work_group_size({local}, 1, 1)))", f"void {name}({args})", "{"]
        return "\n".join([*head, *body, "}"])

    def kernel(self, name: str, params: list[tuple[str, DType]], body: list[str], work_items,
               values: int = 0) -> str:
        """A kernel of one work-item per ``gid`` below ``work_items`` (an int, or a C expression of a
        shape-generic kernel's ``values`` run-time integers: ``long`` arguments after the buffers,
        named by ``clike.numbers.arg``)."""
        args = ", ".join([f"__global {self.mem(dt)}* restrict {p}" for p, dt in params]
                         + [f"const long {arg(k)}" for k in range(values)])
        lines = [f"__kernel void {name}({args})", "{", "    const long gid = (long)get_global_id(0);"]
        lines.append(f"    if (gid >= {work_items}) return;")
        lines += [f"    {b}" if b else "" for b in body]
        lines.append("}")
        return "\n".join(lines)
