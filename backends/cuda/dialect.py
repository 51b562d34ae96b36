"""CUDA C++ as a dialect of ``backends.clike``: the OpenCL C that the portable generator and the
tensor-core emitters write, made CUDA source for NVRTC (``backends.cuda.nvrtc``).

The generated kernels are written once, in OpenCL C (``backends.opencl.target``): the CUDA target
keeps that dialect's choices (float16 through ``vload_half``/``vstore_half_rte``, overloaded math,
``as_uint`` bit casts) and gives them CUDA meanings in a prelude, so both backends run the same
arithmetic. What a prelude cannot say is rewritten on the program text (``translate``):

* ``__kernel`` is ``extern "C" __global__`` (the symbol stays the generated name), a required
  work-group size is ``__launch_bounds__``;
* a ``__local`` array is ``__shared__``; a pointer to ``__local`` memory is a plain (generic)
  pointer, and a ``__local`` address taken as a 32-bit integer for inline PTX (OpenCL's
  ``(uint)(ulong)p``, the shared window's offset on NVIDIA) is ``__cvta_generic_to_shared``;
* OpenCL's vector types (components ``.s0`` ...) are the prelude's ``tile_uint4`` and the like, and a
  vector literal ``(uint4)(x, y, z, w)`` is ``tile_make_uint4(x, y, z, w)``.

Work-item functions read CUDA's indexes: ``get_global_id(0)`` is ``blockIdx.x * blockDim.x +
threadIdx.x``; ``barrier`` is ``__syncthreads``. Float contraction is off (``--fmad=false``, as
OpenCL's ``FP_CONTRACT OFF``); division and square root are correctly rounded (NVRTC's defaults).
"""

from __future__ import annotations

import re

from backends.opencl.target import OpenCLTarget

PRELUDE = r"""
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef unsigned short tile_half; /* float16 in memory: its bits (values live in float registers) */
#define half tile_half
#define __global
#define __private
#define __constant const
#define restrict __restrict__
#define CLK_LOCAL_MEM_FENCE 1
#define CLK_GLOBAL_MEM_FENCE 2
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
__device__ __forceinline__ size_t get_local_id(int d)
{ return d == 0 ? threadIdx.x : d == 1 ? threadIdx.y : threadIdx.z; }
__device__ __forceinline__ size_t get_group_id(int d)
{ return d == 0 ? blockIdx.x : d == 1 ? blockIdx.y : blockIdx.z; }
__device__ __forceinline__ size_t get_local_size(int d)
{ return d == 0 ? blockDim.x : d == 1 ? blockDim.y : blockDim.z; }
__device__ __forceinline__ size_t get_num_groups(int d)
{ return d == 0 ? gridDim.x : d == 1 ? gridDim.y : gridDim.z; }
__device__ __forceinline__ size_t get_global_id(int d)
{ return get_group_id(d) * get_local_size(d) + get_local_id(d); }
__device__ __forceinline__ size_t get_global_size(int d)
{ return get_num_groups(d) * get_local_size(d); }
__device__ __forceinline__ void barrier(int flags)
{ if (flags & CLK_GLOBAL_MEM_FENCE) __threadfence(); __syncthreads(); }
__device__ __forceinline__ void mem_fence(int flags)
{ if (flags & CLK_GLOBAL_MEM_FENCE) __threadfence(); else __threadfence_block(); }
__device__ __forceinline__ uint atomic_inc(volatile uint* p) { return atomicAdd((uint*)p, 1u); }
__device__ __forceinline__ uint atomic_xchg(volatile uint* p, uint v) { return atomicExch((uint*)p, v); }
__device__ __forceinline__ int atomic_inc(volatile int* p) { return atomicAdd((int*)p, 1); }
__device__ __forceinline__ int atomic_xchg(volatile int* p, int v) { return atomicExch((int*)p, v); }
__device__ __forceinline__ float vload_half(size_t i, const half* p)
{ float f; ushort h = p[i]; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ void vstore_half_rte(float x, size_t i, half* p)
{ ushort h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); p[i] = h; }
__device__ __forceinline__ void vstore_half_rte(double x, size_t i, half* p)
{ ushort h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(x)); p[i] = h; }
__device__ __forceinline__ uint as_uint(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint as_uint(uint x) { return x; }
__device__ __forceinline__ uint as_uint(int x) { return (uint)x; }
__device__ __forceinline__ ulong as_ulong(double x) { return (ulong)__double_as_longlong(x); }
__device__ __forceinline__ float as_float(uint x) { return __uint_as_float(x); }
__device__ __forceinline__ float as_float(int x) { return __int_as_float(x); }
__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float mad(float a, float b, float c) { return a * b + c; }
__device__ __forceinline__ double mad(double a, double b, double c) { return a * b + c; }
__device__ __forceinline__ float native_exp(float x) { return __expf(x); }
__device__ __forceinline__ float native_log(float x) { return __logf(x); }
__device__ __forceinline__ float native_sin(float x) { return __sinf(x); }
__device__ __forceinline__ float native_cos(float x) { return __cosf(x); }
__device__ __forceinline__ float native_tan(float x) { return __tanf(x); }
__device__ __forceinline__ float native_sqrt(float x) { return __fsqrt_rn(x); }
__device__ __forceinline__ float native_recip(float x) { return __frcp_rn(x); }
/* OpenCL's vector types: components .s0 .. .sN-1, aligned to their size (tile_<type><N>) */
#define TILE_VEC(T, S) \
struct alignas(2 * sizeof(S)) tile_##T##2 { union { struct { S s0, s1; }; struct { S x, y; }; }; }; \
struct alignas(4 * sizeof(S)) tile_##T##4 \
{ union { struct { S s0, s1, s2, s3; }; struct { S x, y, z, w; }; }; }; \
struct alignas(8 * sizeof(S)) tile_##T##8 { S s0, s1, s2, s3, s4, s5, s6, s7; }; \
__device__ __forceinline__ tile_##T##2 tile_make_##T##2(S a, S b) \
{ tile_##T##2 v; v.s0 = a; v.s1 = b; return v; } \
__device__ __forceinline__ tile_##T##2 tile_make_##T##2(S a) { return tile_make_##T##2(a, a); } \
__device__ __forceinline__ tile_##T##4 tile_make_##T##4(S a, S b, S c, S d) \
{ tile_##T##4 v; v.s0 = a; v.s1 = b; v.s2 = c; v.s3 = d; return v; } \
__device__ __forceinline__ tile_##T##4 tile_make_##T##4(S a) { return tile_make_##T##4(a, a, a, a); } \
__device__ __forceinline__ tile_##T##8 tile_make_##T##8(S a) \
{ tile_##T##8 v; v.s0 = v.s1 = v.s2 = v.s3 = v.s4 = v.s5 = v.s6 = v.s7 = a; return v; }
TILE_VEC(float, float)
TILE_VEC(double, double)
TILE_VEC(char, signed char)
TILE_VEC(uchar, uchar)
TILE_VEC(short, short)
TILE_VEC(ushort, ushort)
TILE_VEC(int, int)
TILE_VEC(uint, uint)
TILE_VEC(long, long)
TILE_VEC(ulong, ulong)
template <class T> __device__ __forceinline__ T select(T a, T b, bool c) { return c ? b : a; }
template <class T> __device__ __forceinline__ T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
"""

_LOCAL_POINTER = re.compile(r"__local\s+((?:const\s+)?\w+\s*\*)")
_SHARED_WORD = re.compile(r"\(uint\)\(ulong\)(\w+)")
_SHARED_EXPR = re.compile(r"\(uint\)\(ulong\)\(")
_GROUP_SIZE = re.compile(r"__attribute__\(\(reqd_work_group_size\((\d+),\s*1,\s*1\)\)\)")
_VECTOR = re.compile(r"\(((?:u?(?:char|short|int|long))|float|double)([248])\)\(")
_VECTOR_TYPE = re.compile(r"\b((?:u?(?:char|short|int|long))|float|double)([248])\b")
_KERNEL = re.compile(r"\b__kernel\b")


def translate(text: str) -> str:
    """The generated OpenCL C program ``text`` (without its header) as CUDA C++ (module docstring)."""
    text = _LOCAL_POINTER.sub(r"\1", text)
    text = _SHARED_WORD.sub(r"(uint)__cvta_generic_to_shared(\1)", text)
    text = _SHARED_EXPR.sub("(uint)__cvta_generic_to_shared(", text)
    text = text.replace("__local", "__shared__")
    text = _GROUP_SIZE.sub(r"__launch_bounds__(\1)", text)
    text = _VECTOR.sub(r"tile_make_\1\2(", text)
    text = _VECTOR_TYPE.sub(r"tile_\1\2", text)
    return _KERNEL.sub('extern "C" __global__', text)


class CudaTarget(OpenCLTarget):
    """OpenCL C's choices, printed as CUDA C++ (module docstring). Helper functions are
    ``__device__``; the file opens with the prelude instead of OpenCL's pragmas."""

    name = "cuda"
    function_qualifier = "__device__ "

    def unit_emitter(self, g, ptrs: dict[str, str], tiles, unit: str, epilogue):
        """NVIDIA's tensor-core kernels (``render``), straight: no OpenCL vendor hook between."""
        from backends.cuda.render import unit_emitter

        return unit_emitter(self, g, ptrs, tiles, unit, epilogue)

    def attention_kernel(self, em):
        """An ``attention`` block or a part of its gradient on the tensor cores
        (``render_attention``, ``render_attention_bwd``), or None."""
        from backends.cuda import render_attention, render_attention_bwd
        from stripe.plans import AttentionBackwardPlan

        if isinstance(em.block.plan, AttentionBackwardPlan):
            return render_attention_bwd.source(em)
        return render_attention.source(em)

    def header(self) -> list[str]:
        return PRELUDE.strip("\n").split("\n")

    def helper_text(self, name: str) -> str | None:
        text = super().helper_text(name)
        return None if text is None else f"__device__ {text}"


__all__ = ["PRELUDE", "CudaTarget", "translate"]
